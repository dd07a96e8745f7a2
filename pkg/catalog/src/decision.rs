//! The storage decision: StorageClass `nvcf-sc` + its provisioner's catalog entry -> either the
//! exact `spec.decision` and `spec.storageClass` a ModelCacheBinding records, or a typed reason
//! why there is no durable cache.
//!
//! Order of the checks (the first that applies wins):
//!
//! 1. feature gates: `CachingSupport`, and `HelmModelCaching` for `helmModelCache`;
//! 2. `nvcf-sc` exists, uses reclaim policy `Retain`, and names a provisioner;
//! 3. the catalog (the ConfigMap, or the built-in copy when the ConfigMap is absent) has an
//!    entry for exactly that provisioner, and the entry gives the workflow a flow;
//! 4. with `ModelCacheEncryption` on, the decided flow is roxReadOnly on a driver that lists
//!    `encryptionSupported` (an encrypted cache is never silently created unencrypted);
//! 5. writer identity for rwxReadOnly: catalog `writerIdentity`, else the CSIDriver's
//!    `fsGroupPolicy`.

use std::fmt;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use warmcache_api_modelcache::MODEL_CACHE_STORAGE_CLASS;
use warmcache_api_modelcache::v2beta1::{
    BindingDecision, BindingStorageClass, ReclaimPolicy, Transition, Workflow,
};

use crate::digest::{profile_digest, storage_class_digest};
use crate::error::{LoadError, quote};
use crate::flow::{DisabledReason, Flow, derive_flow, required_mount_options};
use crate::loader::{DriverProfile, WriterIdentity, is_ecma_whitespace};
use crate::source::CatalogSnapshot;

/// Feature gates that decide whether caching is attempted at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gates {
    /// `CachingSupport`: model caching as a whole.
    pub caching_support: bool,
    /// `HelmModelCaching`: caching for `helmModelCache` (cross-namespace sharing domains).
    pub helm_model_caching: bool,
    /// `ModelCacheEncryption`: caches are encrypted at rest.
    pub model_cache_encryption: bool,
}

impl Gates {
    /// The gates when none is given: caching on, sharing domains on, encryption off.
    pub const DEFAULT: Gates = Gates {
        caching_support: true,
        helm_model_caching: true,
        model_cache_encryption: false,
    };

    /// Why caching is off for `workflow` by a gate (`CachingSupport`, or `HelmModelCaching` for
    /// `helmModelCache`), or `None` when the gates allow it. Evaluated before anything else,
    /// also before an existing binding is joined.
    pub const fn caching_off(&self, workflow: Workflow) -> Option<NonDurable> {
        if !self.caching_support {
            return Some(NonDurable::CachingDisabled);
        }
        if matches!(workflow, Workflow::HelmModelCache) && !self.helm_model_caching {
            return Some(NonDurable::HelmCachingDisabled);
        }
        None
    }

    /// Parses `Name=true|false,...` (the `--feature-gates` flag of the components that decide
    /// or re-decide storage) over [`Gates::DEFAULT`]; an empty text is the defaults.
    ///
    /// # Errors
    ///
    /// The part that is not `Name=true|false`, or an unknown gate, in words.
    pub fn parse(s: &str) -> Result<Gates, String> {
        use warmcache_cli::text;
        let mut g = Gates::DEFAULT;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{} is not Name=true|false", text::shown(part)))?;
            let value = match v.trim() {
                "true" => true,
                "false" => false,
                other => return Err(format!("{}: expected true or false", text::shown(other))),
            };
            match k.trim() {
                "CachingSupport" => g.caching_support = value,
                "HelmModelCaching" => g.helm_model_caching = value,
                "ModelCacheEncryption" => g.model_cache_encryption = value,
                other => {
                    return Err(format!(
                        "unknown feature gate {} (known: CachingSupport, HelmModelCaching, ModelCacheEncryption)",
                        text::shown(other)
                    ));
                }
            }
        }
        Ok(g)
    }
}

/// The catalog input of a decision.
#[derive(Clone, Copy, Debug)]
pub enum CatalogInput<'a> {
    /// The ConfigMap `nvcf-storage-capabilities` was not found: the built-in copy is used and
    /// the outcome says so ([`Outcome::catalog_builtin`]).
    Absent,
    /// The ConfigMap as read; it is authoritative.
    ConfigMap(&'a ConfigMap),
    /// A catalog the caller already loaded (from either of the above).
    Loaded(&'a CatalogSnapshot),
}

/// Everything a decision depends on.
#[derive(Clone, Copy, Debug)]
pub struct DecisionInputs<'a> {
    /// StorageClass `nvcf-sc` as read; `None` when it was not found.
    pub storage_class: Option<&'a StorageClass>,
    /// The CSIDriver named after the StorageClass provisioner; `None` when none is registered.
    /// A CSIDriver with another name is ignored (treated as absent).
    pub csi_driver: Option<&'a CSIDriver>,
    /// The catalog.
    pub catalog: CatalogInput<'a>,
    /// Who reads the cache.
    pub workflow: Workflow,
    /// Feature gates.
    pub gates: Gates,
}

/// Where a writer identity came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriterIdentitySource {
    /// The catalog entry's `writerIdentity`.
    Catalog,
    /// The CSIDriver's `spec.fsGroupPolicy` (the value seen; `None` when unset).
    CsiDriverFsGroupPolicy(Option<String>),
    /// No CSIDriver is registered for the provisioner.
    NoCsiDriver,
}

/// The identity the writer Job of a ReadWriteMany cache runs with, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterIdentityChoice {
    /// The identity.
    pub identity: WriterIdentity,
    /// Where it came from.
    pub source: WriterIdentitySource,
}

/// A durable cache decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The workflow decided for.
    pub workflow: Workflow,
    /// Exactly what `spec.decision` records (its `catalogDigest` is the profile digest).
    pub decision: BindingDecision,
    /// Exactly what `spec.storageClass` records.
    pub storage_class: BindingStorageClass,
    /// The writer identity; `Some` for rwxReadOnly only.
    pub writer_identity: Option<WriterIdentityChoice>,
    /// Revision of the whole catalog payload, for diagnostics.
    pub catalog_revision: String,
    /// Whether the built-in catalog was used (the ConfigMap is absent): the caller logs it and
    /// counts it.
    pub catalog_builtin: bool,
}

/// Why there is no durable cache. Each variant is a distinct outcome with a stable
/// [`reason`](Self::reason) (for conditions, Events and metric labels) and a message a person
/// can act on ([`Display`](fmt::Display)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NonDurable {
    /// The `CachingSupport` gate is off.
    CachingDisabled,
    /// The `HelmModelCaching` gate is off (helmModelCache only).
    HelmCachingDisabled,
    /// StorageClass `nvcf-sc` does not exist.
    StorageClassNotFound,
    /// `nvcf-sc` does not use reclaim policy Retain.
    StorageClassNotRetain {
        /// The reclaim policy found (`None` when unset, which Kubernetes treats as Delete).
        reclaim_policy: Option<String>,
    },
    /// `nvcf-sc` has an empty or whitespace provisioner.
    BlankProvisioner,
    /// The catalog has no entry for the provisioner.
    NoCatalogEntry {
        /// The provisioner of `nvcf-sc`.
        provisioner: String,
        /// Whether the catalog looked in was the built-in copy.
        catalog_builtin: bool,
    },
    /// The catalog entry gives this workflow no flow.
    NoQualifiedFlow {
        /// The provisioner.
        provisioner: String,
        /// Its provider label.
        provider: String,
        /// The workflow.
        workflow: Workflow,
        /// Why.
        why: DisabledReason,
        /// Whether the catalog looked in was the built-in copy.
        catalog_builtin: bool,
    },
    /// Encryption is requested but the decided storage cannot provide it.
    EncryptionUnavailable {
        /// The provisioner.
        provisioner: String,
        /// The transition the catalog gives this workflow.
        transition: Transition,
        /// Whether the driver lists encryption support.
        encryption_supported: bool,
        /// Whether the catalog looked in was the built-in copy.
        catalog_builtin: bool,
    },
}

impl NonDurable {
    /// Stable CamelCase reason (bounded set, safe as a metric label).
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::CachingDisabled => "CachingDisabled",
            Self::HelmCachingDisabled => "HelmCachingDisabled",
            Self::StorageClassNotFound => "StorageClassNotFound",
            Self::StorageClassNotRetain { .. } => "StorageClassNotRetain",
            Self::BlankProvisioner => "StorageClassProvisionerBlank",
            Self::NoCatalogEntry { .. } => "NoCatalogEntry",
            Self::NoQualifiedFlow { .. } => "NoQualifiedFlow",
            Self::EncryptionUnavailable { .. } => "EncryptionUnavailable",
        }
    }

    /// Whether this outcome was reached by consulting the built-in catalog (the ConfigMap is
    /// absent). `false` for outcomes decided before the catalog is consulted (gates,
    /// StorageClass).
    pub const fn catalog_builtin(&self) -> bool {
        match self {
            Self::NoCatalogEntry {
                catalog_builtin, ..
            }
            | Self::NoQualifiedFlow {
                catalog_builtin, ..
            }
            | Self::EncryptionUnavailable {
                catalog_builtin, ..
            } => *catalog_builtin,
            Self::CachingDisabled
            | Self::HelmCachingDisabled
            | Self::StorageClassNotFound
            | Self::StorageClassNotRetain { .. }
            | Self::BlankProvisioner => false,
        }
    }
}

impl fmt::Display for NonDurable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sc = MODEL_CACHE_STORAGE_CLASS;
        match self {
            Self::CachingDisabled => write!(
                f,
                "model caching is off: the CachingSupport feature gate is disabled"
            ),
            Self::HelmCachingDisabled => write!(
                f,
                "cross-namespace model caching is off: the HelmModelCaching feature gate is disabled"
            ),
            Self::StorageClassNotFound => write!(
                f,
                "model cache StorageClass {sc:?} not found: create it with the qualified provisioner and reclaimPolicy Retain to enable durable caching"
            ),
            Self::StorageClassNotRetain { reclaim_policy } => write!(
                f,
                "model cache StorageClass {sc:?} must use reclaimPolicy Retain, it uses {}: cached data must never be deleted by releasing a claim",
                reclaim_policy
                    .as_deref()
                    .map_or_else(|| "the default (Delete)".to_owned(), quote)
            ),
            Self::BlankProvisioner => write!(
                f,
                "model cache StorageClass {sc:?} has an empty provisioner"
            ),
            Self::NoCatalogEntry {
                provisioner,
                catalog_builtin,
            } => write!(
                f,
                "model cache StorageClass {sc:?} uses provisioner {} with no entry in the {} storage capability catalog: caching stays off until the driver is qualified and listed",
                quote(provisioner),
                if *catalog_builtin {
                    "built-in"
                } else {
                    "configured"
                }
            ),
            Self::NoQualifiedFlow {
                provisioner,
                provider,
                workflow,
                why,
                ..
            } => write!(
                f,
                "provisioner {} (provider {}) gives {} no durable cache: {why}",
                quote(provisioner),
                quote(provider),
                workflow.as_str()
            ),
            Self::EncryptionUnavailable {
                provisioner,
                transition,
                encryption_supported,
                ..
            } => {
                if *transition == Transition::RwxReadOnly {
                    write!(
                        f,
                        "model cache encryption is on but provisioner {} gives the rwxReadOnly transition, which does not support encryption",
                        quote(provisioner)
                    )
                } else if !encryption_supported {
                    write!(
                        f,
                        "model cache encryption is on but the catalog entry of provisioner {} does not list encryptionSupported",
                        quote(provisioner)
                    )
                } else {
                    write!(
                        f,
                        "model cache encryption is on but provisioner {} cannot provide it",
                        quote(provisioner)
                    )
                }
            }
        }
    }
}

/// The result of a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A durable cache, decided.
    Durable(Box<Decision>),
    /// No durable cache, and why.
    NonDurable(NonDurable),
}

impl Outcome {
    /// Whether the built-in catalog decided this outcome: the ConfigMap
    /// `nvcf-storage-capabilities` is absent and the decision got as far as the catalog. The
    /// caller logs a warning and counts it whenever this is true; nothing else about the outcome
    /// differs from what the same catalog in a ConfigMap gives.
    pub fn catalog_builtin(&self) -> bool {
        match self {
            Self::Durable(decision) => decision.catalog_builtin,
            Self::NonDurable(reason) => reason.catalog_builtin(),
        }
    }
}

/// Inputs that make a decision impossible (retry after they are fixed; nothing is decided).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// The catalog ConfigMap exists but does not hold a valid catalog.
    #[error(transparent)]
    Catalog(#[from] LoadError),
    /// The StorageClass given is not `nvcf-sc`.
    #[error("the model cache StorageClass must be {expected:?}, got {found:?}")]
    WrongStorageClass {
        /// `nvcf-sc`.
        expected: &'static str,
        /// The name of the object given.
        found: String,
    },
    /// The StorageClass given has no UID (it was not read from the API server).
    #[error(
        "StorageClass {MODEL_CACHE_STORAGE_CLASS:?} has no metadata.uid: pass the object as read from the API server"
    )]
    StorageClassWithoutUid,
    /// The CSIDriver given is not the one named after the StorageClass's provisioner.
    #[error(
        "the CSIDriver passed must be the one named after the provisioner {expected:?}, got {found:?}: pass the CSIDriver read by that name, or none when it does not exist"
    )]
    WrongCsiDriver {
        /// The provisioner of the StorageClass.
        expected: String,
        /// The name of the CSIDriver given.
        found: String,
    },
}

/// Decides how a cache for `inputs.workflow` is stored (module docs for the order of checks).
/// Pure: the same inputs always give the same outcome.
pub fn decide(inputs: &DecisionInputs<'_>) -> Result<Outcome, DecisionError> {
    let non_durable = |n| Ok(Outcome::NonDurable(n));
    if let Some(off) = inputs.gates.caching_off(inputs.workflow) {
        return non_durable(off);
    }
    let Some(class) = inputs.storage_class else {
        return non_durable(NonDurable::StorageClassNotFound);
    };
    let name = class.metadata.name.as_deref().unwrap_or_default();
    if name != MODEL_CACHE_STORAGE_CLASS {
        return Err(DecisionError::WrongStorageClass {
            expected: MODEL_CACHE_STORAGE_CLASS,
            found: name.to_owned(),
        });
    }
    let uid = match class.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid,
        _ => return Err(DecisionError::StorageClassWithoutUid),
    };
    if class.reclaim_policy.as_deref() != Some("Retain") {
        return non_durable(NonDurable::StorageClassNotRetain {
            reclaim_policy: class.reclaim_policy.clone(),
        });
    }
    let provisioner = class.provisioner.as_str();
    if provisioner.chars().all(is_ecma_whitespace) {
        return non_durable(NonDurable::BlankProvisioner);
    }
    if let Some(csi) = inputs.csi_driver {
        let found = csi.metadata.name.as_deref().unwrap_or_default();
        if found != provisioner {
            return Err(DecisionError::WrongCsiDriver {
                expected: provisioner.to_owned(),
                found: found.to_owned(),
            });
        }
    }

    let loaded;
    let snapshot = match inputs.catalog {
        CatalogInput::Loaded(snapshot) => snapshot,
        CatalogInput::Absent => {
            loaded = CatalogSnapshot::from_config_map(None)?;
            &loaded
        }
        CatalogInput::ConfigMap(cm) => {
            loaded = CatalogSnapshot::from_config_map(Some(cm))?;
            &loaded
        }
    };
    let Some(driver) = snapshot.catalog().driver(provisioner) else {
        return non_durable(NonDurable::NoCatalogEntry {
            provisioner: provisioner.to_owned(),
            catalog_builtin: snapshot.is_builtin(),
        });
    };
    let flow = derive_flow(driver, inputs.workflow);
    let transition = match flow {
        Flow::Enabled(t) => t,
        Flow::Disabled(why) => {
            return non_durable(NonDurable::NoQualifiedFlow {
                provisioner: provisioner.to_owned(),
                provider: driver.provider.clone(),
                workflow: inputs.workflow,
                why,
                catalog_builtin: snapshot.is_builtin(),
            });
        }
    };
    let encryption_required = inputs.gates.model_cache_encryption;
    if encryption_required
        && (transition != Transition::RoxReadOnly || !driver.encryption_supported)
    {
        return non_durable(NonDurable::EncryptionUnavailable {
            provisioner: provisioner.to_owned(),
            transition,
            encryption_supported: driver.encryption_supported,
            catalog_builtin: snapshot.is_builtin(),
        });
    }
    let writer_identity =
        (transition == Transition::RwxReadOnly).then(|| writer_identity(driver, inputs.csi_driver));

    Ok(Outcome::Durable(Box::new(Decision {
        workflow: inputs.workflow,
        decision: BindingDecision {
            provider: driver.provider.clone(),
            provisioner: provisioner.to_owned(),
            transition,
            required_access_modes: transition.required_access_modes().to_vec(),
            required_mount_options: required_mount_options(driver, flow),
            catalog_digest: profile_digest(driver, inputs.workflow, flow),
            encryption_required,
            writer_identity: writer_identity.as_ref().map(|choice| choice.identity),
        },
        storage_class: BindingStorageClass {
            name: MODEL_CACHE_STORAGE_CLASS.to_owned(),
            uid: uid.to_owned(),
            reclaim_policy: ReclaimPolicy::Retain,
            configuration_digest: storage_class_digest(class),
        },
        writer_identity,
        catalog_revision: snapshot.revision().to_owned(),
        catalog_builtin: snapshot.is_builtin(),
    })))
}

/// Writer identity of a ReadWriteMany cache: the catalog's `writerIdentity` when set; else
/// from the CSIDriver named after the provisioner: `fsGroupPolicy: File` -> fsGroup (Kubernetes
/// applies the pod's fsGroup); `ReadWriteOnceWithFSType`, `None`, unset or any other value ->
/// root (Kubernetes does not change ownership of a ReadWriteMany volume, so a non-root writer
/// could get EACCES on a fresh export); no CSIDriver -> fsGroup.
pub fn writer_identity(
    driver: &DriverProfile,
    csi_driver: Option<&CSIDriver>,
) -> WriterIdentityChoice {
    if let Some(identity) = driver.writer_identity {
        return WriterIdentityChoice {
            identity,
            source: WriterIdentitySource::Catalog,
        };
    }
    let csi_driver =
        csi_driver.filter(|d| d.metadata.name.as_deref() == Some(driver.name.as_str()));
    match csi_driver {
        None => WriterIdentityChoice {
            identity: WriterIdentity::FsGroup,
            source: WriterIdentitySource::NoCsiDriver,
        },
        Some(d) => {
            let policy = d.spec.fs_group_policy.clone();
            let identity = if policy.as_deref() == Some("File") {
                WriterIdentity::FsGroup
            } else {
                WriterIdentity::Root
            };
            WriterIdentityChoice {
                identity,
                source: WriterIdentitySource::CsiDriverFsGroupPolicy(policy),
            }
        }
    }
}
