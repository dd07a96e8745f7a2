//! Encrypted caches (`ModelCacheEncryption`): the StorageClass and the key Secret a binding
//! owns, derived without a client.
//!
//! A binding whose decision says `encryptionRequired` (only roxReadOnly on a driver whose catalog
//! entry lists `encryptionSupported`) records two names in `spec.resources` when it is created:
//! the Secret `<hash>` in the control namespace, holding a key warmcache generates, and the
//! StorageClass `<hash>-sc`, a copy of `nvcf-sc` (the very object the decision was taken on:
//! same UID and configuration digest) whose parameters add the CSI secret parameters naming that
//! Secret:
//!
//! | parameter | the CSI call that receives the key |
//! |---|---|
//! | `csi.storage.k8s.io/provisioner-secret-name`, `-namespace` | CreateVolume and DeleteVolume (the external-provisioner records the reference on the PV for the delete) |
//! | `csi.storage.k8s.io/node-stage-secret-name`, `-namespace` | NodeStageVolume (the PV's `spec.csi.nodeStageSecretRef`) |
//! | `csi.storage.k8s.io/node-publish-secret-name`, `-namespace` | NodePublishVolume (the PV's `spec.csi.nodePublishSecretRef`) |
//!
//! The primary claim is provisioned on that class, so the primary PV carries the references,
//! and every read-only view, a copy of the primary's PV, carries them too: every reader's
//! kubelet hands the key to the driver. The binding controller creates the Secret first, then
//! the class, both before the staging Job; the key is created only while no primary exists (a
//! new key could never open data written under an old one). The Secret and the class outlive
//! the binding: they hold what opens and deletes the retained primary, which a later binding of
//! the same cache adopts; the reaper deletes them once no binding, claim or PV needs them.
//!
//! The key itself appears only in the Secret's `data`: [`EncryptionKey`]'s `Debug` is redacted,
//! no [`crate::lifecycle::Action`] carries it (the controller generates it at the create), and
//! every other reader of the Secret (the controller, the reaper) reads its metadata only.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warmcache_api_modelcache::identity_hash;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_catalog::storage_class_digest;

use crate::keys::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODEL_LABEL};
use crate::volume_keys::VOLUME_ROLE_LABEL;

/// Value of [`VOLUME_ROLE_LABEL`] on an encrypted cache's Secret and StorageClass.
pub const ROLE_ENCRYPTION: &str = "encryption";
/// The Secret's entry that holds the key (the CSI secrets map the driver receives).
pub const KEY_ENTRY: &str = "key";
/// Random bytes in a key (written as 64 lowercase hex characters: CSI secrets are strings).
pub const KEY_BYTES: usize = 32;
/// Annotation on the Secret and the StorageClass: the binding that created them (for people;
/// a later binding of the same cache adopts them, so nothing decides on it).
pub const CREATED_FOR_ANNOTATION: &str = "warmcache.nvidia.io/created-for-binding";

/// The CSI secret parameters an encrypted class carries: (name key, namespace key).
pub const SECRET_PARAMETERS: [(&str, &str); 3] = [
    (
        "csi.storage.k8s.io/provisioner-secret-name",
        "csi.storage.k8s.io/provisioner-secret-namespace",
    ),
    (
        "csi.storage.k8s.io/node-stage-secret-name",
        "csi.storage.k8s.io/node-stage-secret-namespace",
    ),
    (
        "csi.storage.k8s.io/node-publish-secret-name",
        "csi.storage.k8s.io/node-publish-secret-namespace",
    ),
];

/// Prefix of every CSI secret parameter (`csi.storage.k8s.io/<call>-secret-name|namespace`):
/// a base class's own are not copied, so only this binding's Secret is ever named.
const CSI_PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";

/// The names of an encrypted binding's Secret and StorageClass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncryptionNames {
    /// The Secret, in [`EncryptionNames::namespace`].
    pub secret: String,
    /// Its namespace: the binding's (the control namespace).
    pub namespace: String,
    /// The StorageClass (cluster-scoped).
    pub class: String,
}

/// Why an encrypted binding's objects cannot be derived or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncryptionError {
    /// `spec.resources` does not name exactly the Secret and class derived from the identity.
    #[error(
        "spec.resources.{field} is {got:?}, but an encrypted binding of this cache names exactly [{want:?}]"
    )]
    WrongNames {
        /// `secretNames` or `storageClassNames`.
        field: &'static str,
        /// What the binding records.
        got: Vec<String>,
        /// The derived name.
        want: String,
    },
    /// The binding has no namespace (not read from the API server).
    #[error("the binding has no namespace")]
    NoNamespace,
    /// The StorageClass read under the decision's name is not the one the decision was taken on.
    #[error(
        "StorageClass {name} is not the one this binding's decision was taken on ({what}); an encrypted class is derived only from that one"
    )]
    BaseChanged {
        /// The base class's name.
        name: String,
        /// What differs.
        what: String,
    },
    /// The base class is absent.
    #[error(
        "StorageClass {name}, which this binding's decision was taken on, does not exist; an encrypted class is derived only from it"
    )]
    BaseMissing {
        /// The base class's name.
        name: String,
    },
}

/// The Secret and class an encrypted `binding` owns, checked against the names derived from its
/// identity (a hand-written binding cannot name someone else's Secret); `None` when the binding
/// is not encrypted.
///
/// # Errors
///
/// [`EncryptionError::WrongNames`] or [`EncryptionError::NoNamespace`].
pub fn encryption_names(
    binding: &ModelCacheBinding,
) -> Result<Option<EncryptionNames>, EncryptionError> {
    if !binding.spec.decision.encryption_required {
        return Ok(None);
    }
    let hash = identity_hash(&binding.spec.identity);
    let secret = secret_name(&hash);
    let class = class_name(&hash);
    let r = &binding.spec.resources;
    if r.secret_names != [secret.clone()] {
        return Err(EncryptionError::WrongNames {
            field: "secretNames",
            got: r.secret_names.clone(),
            want: secret,
        });
    }
    if r.storage_class_names != [class.clone()] {
        return Err(EncryptionError::WrongNames {
            field: "storageClassNames",
            got: r.storage_class_names.clone(),
            want: class,
        });
    }
    let namespace = binding
        .metadata
        .namespace
        .clone()
        .ok_or(EncryptionError::NoNamespace)?;
    Ok(Some(EncryptionNames {
        secret,
        namespace,
        class,
    }))
}

/// The key Secret's name for a cache whose identity hash is `hash`: the hash itself.
pub fn secret_name(hash: &str) -> String {
    hash.to_owned()
}

/// The encrypted StorageClass's name for a cache whose identity hash is `hash`: `<hash>-sc`.
pub fn class_name(hash: &str) -> String {
    format!("{hash}-sc")
}

/// The StorageClass the primary claim of `binding` is provisioned on: the encrypted class
/// derived from its identity when the decision requires encryption (whatever `spec.resources`
/// says: a binding that names other objects gets a claim that stays Pending, never an
/// unencrypted volume), else the decision's class (`nvcf-sc`).
pub fn primary_class(binding: &ModelCacheBinding) -> String {
    if binding.spec.decision.encryption_required {
        class_name(&identity_hash(&binding.spec.identity))
    } else {
        binding.spec.storage_class.name.clone()
    }
}

/// A generated key. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptionKey([u8; KEY_BYTES]);

impl EncryptionKey {
    /// A key of `bytes` (from the operating system's random source: the caller's).
    pub const fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EncryptionKey(<redacted>)")
    }
}

fn labels(binding: &ModelCacheBinding) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (
            MODEL_LABEL.to_owned(),
            identity_hash(&binding.spec.identity),
        ),
        (VOLUME_ROLE_LABEL.to_owned(), ROLE_ENCRYPTION.to_owned()),
    ])
}

fn annotations(binding: &ModelCacheBinding) -> Option<BTreeMap<String, String>> {
    binding
        .metadata
        .name
        .as_ref()
        .map(|n| BTreeMap::from([(CREATED_FOR_ANNOTATION.to_owned(), n.clone())]))
}

/// The key Secret of `binding`: `names.secret` in the control namespace, type Opaque, immutable,
/// `data.key` the key as 64 lowercase hex characters, labelled as warmcache's encryption object
/// of this cache.
pub fn key_secret(
    binding: &ModelCacheBinding,
    names: &EncryptionNames,
    key: &EncryptionKey,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(names.secret.clone()),
            namespace: Some(names.namespace.clone()),
            labels: Some(labels(binding)),
            annotations: annotations(binding),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            KEY_ENTRY.to_owned(),
            ByteString(hex::encode(key.0).into_bytes()),
        )])),
        ..Secret::default()
    }
}

/// The encrypted StorageClass of `binding`, derived from `base`, the class read under the
/// decision's name: it must be the object the decision was taken on (the recorded UID and
/// configuration digest). Provisioner, reclaim policy (Retain), binding mode, expansion, mount
/// options and topologies are copied; the parameters are the base's without its CSI secret
/// parameters, plus [`SECRET_PARAMETERS`] naming the key Secret.
///
/// # Errors
///
/// [`EncryptionError::BaseMissing`] or [`EncryptionError::BaseChanged`].
pub fn encrypted_class(
    binding: &ModelCacheBinding,
    names: &EncryptionNames,
    base: Option<&StorageClass>,
) -> Result<StorageClass, EncryptionError> {
    let recorded = &binding.spec.storage_class;
    let Some(base) = base else {
        return Err(EncryptionError::BaseMissing {
            name: recorded.name.clone(),
        });
    };
    let changed = |what: String| EncryptionError::BaseChanged {
        name: recorded.name.clone(),
        what,
    };
    if base.metadata.name.as_deref() != Some(recorded.name.as_str()) {
        return Err(changed(format!(
            "it is named {}",
            base.metadata.name.as_deref().unwrap_or("<none>")
        )));
    }
    if base.metadata.uid.as_deref() != Some(recorded.uid.as_str()) {
        return Err(changed(format!(
            "its UID is {}, the decision recorded {}",
            base.metadata.uid.as_deref().unwrap_or("<none>"),
            recorded.uid
        )));
    }
    let digest = storage_class_digest(base);
    if digest != recorded.configuration_digest {
        return Err(changed(format!(
            "its configuration digest is {digest}, the decision recorded {}",
            recorded.configuration_digest
        )));
    }
    if base.provisioner != binding.spec.decision.provisioner {
        return Err(changed(format!(
            "its provisioner is {}, the decision's is {}",
            base.provisioner, binding.spec.decision.provisioner
        )));
    }
    let mut parameters: BTreeMap<String, String> = base
        .parameters
        .iter()
        .flatten()
        .filter(|(k, _)| !is_secret_parameter(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (name, namespace) in SECRET_PARAMETERS {
        parameters.insert(name.to_owned(), names.secret.clone());
        parameters.insert(namespace.to_owned(), names.namespace.clone());
    }
    Ok(StorageClass {
        metadata: ObjectMeta {
            name: Some(names.class.clone()),
            labels: Some(labels(binding)),
            annotations: annotations(binding),
            ..ObjectMeta::default()
        },
        provisioner: base.provisioner.clone(),
        parameters: Some(parameters),
        reclaim_policy: Some(crate::view::RETAIN.to_owned()),
        volume_binding_mode: base.volume_binding_mode.clone(),
        allow_volume_expansion: base.allow_volume_expansion,
        mount_options: base.mount_options.clone(),
        allowed_topologies: base.allowed_topologies.clone(),
    })
}

/// Whether `key` is a CSI secret parameter (`csi.storage.k8s.io/*-secret-name|namespace`).
fn is_secret_parameter(key: &str) -> bool {
    key.strip_prefix(CSI_PARAMETER_PREFIX)
        .is_some_and(|rest| rest.ends_with("-secret-name") || rest.ends_with("-secret-namespace"))
}

/// Whether `meta` (a Secret's or StorageClass's) is warmcache's encryption object of `binding`'s
/// cache: managed by warmcache, the cache's model label, the encryption role. An object under
/// the name without them is someone else's: never adopted, never overwritten.
///
/// # Errors
///
/// What is missing, for a `ForeignObject` condition.
pub fn check_ours(meta: &ObjectMeta, binding: &ModelCacheBinding) -> Result<(), String> {
    let want = labels(binding);
    let have = meta.labels.clone().unwrap_or_default();
    let missing: Vec<String> = want
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("it lacks the labels {}", missing.join(", ")))
    }
}

/// Whether the existing encrypted `class` still serves `binding`: warmcache's for this cache
/// ([`check_ours`]), the decision's provisioner, Retain, and every [`SECRET_PARAMETERS`] naming
/// the key Secret. A class a later binding adopts may otherwise differ from what would be
/// derived today (the base class was edited since): it is the one the retained data was written
/// with, so it is kept.
///
/// # Errors
///
/// What is wrong, for a `ForeignObject` condition.
pub fn check_class(
    class: &StorageClass,
    binding: &ModelCacheBinding,
    names: &EncryptionNames,
) -> Result<(), String> {
    check_ours(&class.metadata, binding)?;
    let mut wrong = Vec::new();
    if class.provisioner != binding.spec.decision.provisioner {
        wrong.push(format!(
            "provisioner {} (the decision's is {})",
            class.provisioner, binding.spec.decision.provisioner
        ));
    }
    if class.reclaim_policy.as_deref() != Some(crate::view::RETAIN) {
        wrong.push(format!(
            "reclaimPolicy {}",
            class.reclaim_policy.as_deref().unwrap_or("<unset>")
        ));
    }
    let params = class.parameters.clone().unwrap_or_default();
    for (name, namespace) in SECRET_PARAMETERS {
        if params.get(name) != Some(&names.secret)
            || params.get(namespace) != Some(&names.namespace)
        {
            wrong.push(format!(
                "parameters {name}/{namespace} do not name Secret {}/{}",
                names.namespace, names.secret
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::TopologySelectorTerm;

    use super::*;
    use crate::testing::binding;

    fn encrypted() -> ModelCacheBinding {
        let mut b = binding(warmcache_api_modelcache::v2beta1::Transition::RoxReadOnly);
        b.spec.decision.encryption_required = true;
        let hash = identity_hash(&b.spec.identity);
        b.spec.resources.secret_names = vec![hash.clone()];
        b.spec.resources.storage_class_names = vec![format!("{hash}-sc")];
        b
    }

    fn base(b: &ModelCacheBinding) -> StorageClass {
        let mut class = StorageClass {
            metadata: ObjectMeta {
                name: Some("nvcf-sc".into()),
                uid: Some(b.spec.storage_class.uid.clone()),
                labels: Some(BTreeMap::from([("team".into(), "storage".into())])),
                ..ObjectMeta::default()
            },
            provisioner: b.spec.decision.provisioner.clone(),
            parameters: Some(BTreeMap::from([
                ("csi.storage.k8s.io/fstype".into(), "xfs".into()),
                ("vpg".into(), "DEFAULT_CONCATENATED_VPG".into()),
                (
                    "csi.storage.k8s.io/node-publish-secret-name".into(),
                    "someone-elses".into(),
                ),
                (
                    "csi.storage.k8s.io/controller-expand-secret-namespace".into(),
                    "other".into(),
                ),
            ])),
            reclaim_policy: Some("Retain".into()),
            volume_binding_mode: Some("WaitForFirstConsumer".into()),
            allow_volume_expansion: Some(true),
            mount_options: Some(vec!["noatime".into()]),
            allowed_topologies: Some(vec![TopologySelectorTerm::default()]),
        };
        class.metadata.uid = Some(b.spec.storage_class.uid.clone());
        class
    }

    fn recorded_on(mut b: ModelCacheBinding, class: &StorageClass) -> ModelCacheBinding {
        b.spec.storage_class.configuration_digest = storage_class_digest(class);
        b
    }

    #[test]
    fn names_are_derived_and_checked() {
        let b = encrypted();
        let hash = identity_hash(&b.spec.identity);
        let names = encryption_names(&b).unwrap().unwrap();
        assert_eq!(names.secret, hash);
        assert_eq!(names.class, format!("{hash}-sc"));
        assert_eq!(
            Some(names.namespace.as_str()),
            b.metadata.namespace.as_deref()
        );
        assert_eq!(primary_class(&b), names.class);

        let mut plain = encrypted();
        plain.spec.decision.encryption_required = false;
        assert_eq!(encryption_names(&plain).unwrap(), None);
        assert_eq!(primary_class(&plain), "nvcf-sc");

        // A hand-written binding cannot name another Secret or class.
        let mut other = encrypted();
        other.spec.resources.secret_names = vec!["registry-credentials".into()];
        let e = encryption_names(&other).unwrap_err();
        assert!(e.to_string().contains("spec.resources.secretNames"), "{e}");
        let mut two = encrypted();
        two.spec
            .resources
            .storage_class_names
            .push("nvcf-sc".into());
        let e = encryption_names(&two).unwrap_err();
        assert!(e.to_string().contains("storageClassNames"), "{e}");
        // The claim still goes to the derived encrypted class, never to nvcf-sc.
        assert_eq!(primary_class(&two), names.class);
    }

    #[test]
    fn the_secret_holds_a_hex_key_and_debug_never_shows_it() {
        let b = encrypted();
        let names = encryption_names(&b).unwrap().unwrap();
        let key = EncryptionKey::from_bytes([0xab; KEY_BYTES]);
        assert_eq!(format!("{key:?}"), "EncryptionKey(<redacted>)");
        let s = key_secret(&b, &names, &key);
        assert_eq!(s.metadata.name.as_deref(), Some(names.secret.as_str()));
        assert_eq!(
            s.metadata.namespace.as_deref(),
            Some(names.namespace.as_str())
        );
        assert_eq!(s.immutable, Some(true));
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        let data = s.data.as_ref().unwrap();
        assert_eq!(data.len(), 1);
        assert_eq!(data[KEY_ENTRY].0, "ab".repeat(KEY_BYTES).into_bytes());
        check_ours(&s.metadata, &b).unwrap();
    }

    #[test]
    fn the_class_copies_the_recorded_base_and_names_only_the_key_secret() {
        let b0 = encrypted();
        let base = base(&b0);
        let b = recorded_on(b0, &base);
        let names = encryption_names(&b).unwrap().unwrap();
        let class = encrypted_class(&b, &names, Some(&base)).unwrap();
        assert_eq!(class.metadata.name.as_deref(), Some(names.class.as_str()));
        assert_eq!(class.provisioner, base.provisioner);
        assert_eq!(class.reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(class.volume_binding_mode, base.volume_binding_mode);
        assert_eq!(class.allow_volume_expansion, Some(true));
        assert_eq!(class.mount_options, base.mount_options);
        assert_eq!(class.allowed_topologies, base.allowed_topologies);
        let p = class.parameters.as_ref().unwrap();
        assert_eq!(p["csi.storage.k8s.io/fstype"], "xfs");
        assert_eq!(p["vpg"], "DEFAULT_CONCATENATED_VPG");
        // The base's own secret parameters are not copied; ours name the key Secret.
        assert!(!p.contains_key("csi.storage.k8s.io/controller-expand-secret-namespace"));
        for (name, namespace) in SECRET_PARAMETERS {
            assert_eq!(p[name], names.secret);
            assert_eq!(p[namespace], names.namespace);
        }
        assert_eq!(p.len(), 2 + 2 * SECRET_PARAMETERS.len());
        // The base's labels are not copied: the class is labelled as warmcache's.
        check_ours(&class.metadata, &b).unwrap();
        assert!(!class.metadata.labels.as_ref().unwrap().contains_key("team"));
        check_class(&class, &b, &names).unwrap();
    }

    #[test]
    fn the_class_is_derived_only_from_the_base_the_decision_recorded() {
        let b0 = encrypted();
        let base = base(&b0);
        let b = recorded_on(b0, &base);
        let names = encryption_names(&b).unwrap().unwrap();
        let e = encrypted_class(&b, &names, None).unwrap_err();
        assert!(matches!(e, EncryptionError::BaseMissing { .. }), "{e}");

        let mut recreated = base.clone();
        recreated.metadata.uid = Some("another-uid".into());
        let e = encrypted_class(&b, &names, Some(&recreated)).unwrap_err();
        assert!(e.to_string().contains("its UID is another-uid"), "{e}");

        let mut edited = base.clone();
        edited
            .parameters
            .as_mut()
            .unwrap()
            .insert("vpg".into(), "OTHER".into());
        let e = encrypted_class(&b, &names, Some(&edited)).unwrap_err();
        assert!(e.to_string().contains("configuration digest"), "{e}");

        let mut renamed = base.clone();
        renamed.metadata.name = Some("other-sc".into());
        let e = encrypted_class(&b, &names, Some(&renamed)).unwrap_err();
        assert!(e.to_string().contains("it is named other-sc"), "{e}");
    }

    #[test]
    fn foreign_objects_and_classes_that_do_not_name_the_key_are_refused() {
        let b0 = encrypted();
        let base = base(&b0);
        let b = recorded_on(b0, &base);
        let names = encryption_names(&b).unwrap().unwrap();
        let class = encrypted_class(&b, &names, Some(&base)).unwrap();

        let mut foreign = class.clone();
        foreign.metadata.labels = None;
        let e = check_class(&foreign, &b, &names).unwrap_err();
        assert!(e.contains("app.kubernetes.io/managed-by=warmcache"), "{e}");

        let mut other_cache = class.clone();
        other_cache
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(MODEL_LABEL.into(), "0".repeat(48));
        assert!(check_class(&other_cache, &b, &names).is_err());

        let mut repointed = class.clone();
        repointed.parameters.as_mut().unwrap().insert(
            "csi.storage.k8s.io/node-publish-secret-name".into(),
            "other".into(),
        );
        let e = check_class(&repointed, &b, &names).unwrap_err();
        assert!(e.contains("node-publish-secret-name"), "{e}");

        let mut deleting = class;
        deleting.reclaim_policy = Some("Delete".into());
        let e = check_class(&deleting, &b, &names).unwrap_err();
        assert!(e.contains("reclaimPolicy Delete"), "{e}");
    }

    #[test]
    fn every_view_of_an_encrypted_primary_carries_its_secret_references() {
        use k8s_openapi::api::core::v1::SecretReference;
        let b = encrypted();
        let names = encryption_names(&b).unwrap().unwrap();
        let reference = SecretReference {
            name: Some(names.secret.clone()),
            namespace: Some(names.namespace.clone()),
        };
        let mut primary = crate::testing::primary_pv();
        primary.spec.as_mut().unwrap().storage_class_name = Some(names.class.clone());
        let csi = primary.spec.as_mut().unwrap().csi.as_mut().unwrap();
        csi.node_publish_secret_ref = Some(reference.clone());
        csi.node_stage_secret_ref = Some(reference.clone());
        for namespace in ["team-a", "team-b"] {
            let (pv, claim) =
                crate::view::read_only_view(&b, &primary, namespace, None, &[]).unwrap();
            let csi = pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
            assert_eq!(
                csi.node_publish_secret_ref.as_ref(),
                Some(&reference),
                "{namespace}"
            );
            assert_eq!(
                csi.node_stage_secret_ref.as_ref(),
                Some(&reference),
                "{namespace}"
            );
            assert_eq!(csi.read_only, Some(true));
            // Static views have no class; the key comes with the PV, not a class.
            assert_eq!(
                pv.spec.as_ref().unwrap().storage_class_name.as_deref(),
                Some("")
            );
            assert_eq!(
                claim.spec.as_ref().unwrap().storage_class_name.as_deref(),
                Some("")
            );
        }
        // The primary claim asks for the encrypted class.
        let claim = crate::view::primary_claim(
            &b,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
        );
        assert_eq!(
            claim.spec.unwrap().storage_class_name.as_deref(),
            Some(names.class.as_str())
        );
    }
}
