//! The storage selection a pod records before any storage side effect (annotation
//! [`STORAGE_SELECTION_ANNOTATION`](crate::STORAGE_SELECTION_ANNOTATION), JSON, contract
//! version [`SELECTION_VERSION`](crate::SELECTION_VERSION)).
//!
//! The webhook writes one on every pod it takes a storage decision for: `durable` on a pod
//! that reads a shared cache (with the decision the binding froze and, once the binding is
//! stored, its name and UID), `none` or `ephemeral` on a pod that keeps its own download. It is
//! what a person (or a later admission) reads to know which storage a pod was admitted on.
//!
//! [`Selection::parse`] is strict: unknown fields and a second JSON value are refused, and
//! [`Selection::validate`] applies the contract's rules (mode and workflow, the binding
//! reference, resolved fields complete and consistent with the transition).

use serde::{Deserialize, Serialize};

use crate::v2beta1::{
    AccessMode, BindingDecision, BindingStorageClass, Transition, Workflow, WriterIdentity,
};
use crate::{MODEL_CACHE_STORAGE_CLASS, SELECTION_VERSION};

/// Which cache a pod was admitted with.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// No cache: the pod downloads as it was written (caching is off, or this workflow has no
    /// qualified durable storage).
    None,
    /// Cross-namespace workflow without durable storage: the pod keeps its own download, into
    /// its own (pod-lifetime) landing.
    Ephemeral,
    /// The pod reads one shared read-only copy (a ModelCacheBinding).
    Durable,
}

impl Mode {
    /// The serialized value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ephemeral => "ephemeral",
            Self::Durable => "durable",
        }
    }

    /// The non-durable mode a workflow falls back to when it has no durable storage:
    /// `ephemeral` for `helmModelCache`, `none` for `regularModelCache`. (Caching turned off
    /// by a feature gate is always `none`.)
    pub const fn fallback(workflow: Workflow) -> Self {
        match workflow {
            Workflow::HelmModelCache => Self::Ephemeral,
            Workflow::RegularModelCache => Self::None,
        }
    }
}

/// The flow a selection records: a binding's transition, or `disabled` when there is none.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum SelectionTransition {
    /// One ReadWriteMany volume, mounted read-only by readers.
    RwxReadOnly,
    /// A ReadWriteOnce volume written once, then ReadOnlyMany views.
    RoxReadOnly,
    /// No durable flow.
    Disabled,
}

impl From<Transition> for SelectionTransition {
    fn from(t: Transition) -> Self {
        match t {
            Transition::RwxReadOnly => Self::RwxReadOnly,
            Transition::RoxReadOnly => Self::RoxReadOnly,
        }
    }
}

impl SelectionTransition {
    /// The binding transition, `None` for `disabled`.
    pub const fn transition(self) -> Option<Transition> {
        match self {
            Self::RwxReadOnly => Some(Transition::RwxReadOnly),
            Self::RoxReadOnly => Some(Transition::RoxReadOnly),
            Self::Disabled => None,
        }
    }
}

/// A recorded storage selection. Optional fields are omitted when empty.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selection {
    /// Contract version: [`SELECTION_VERSION`].
    pub version: String,
    /// The workflow the pod's namespace gives it.
    pub workflow: Workflow,
    /// Which cache.
    pub mode: Mode,
    /// The model cache StorageClass decided on (`nvcf-sc`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class_name: String,
    /// Its UID.
    #[serde(
        default,
        rename = "storageClassUID",
        skip_serializing_if = "String::is_empty"
    )]
    pub storage_class_uid: String,
    /// Its configuration digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class_digest: String,
    /// The catalog profile digest of the driver for this workflow.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub catalog_digest: String,
    /// The catalog's provider label.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// The StorageClass's provisioner.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provisioner: String,
    /// The flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<SelectionTransition>,
    /// Access modes the flow needs, in the transition's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_access_modes: Vec<AccessMode>,
    /// Mount options every read-only view gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_mount_options: Vec<String>,
    /// Whether the cache is encrypted at rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encryption_required: bool,
    /// The binding's name, once it is stored.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub binding_name: String,
    /// The binding's UID, once it is stored.
    #[serde(
        default,
        rename = "bindingUID",
        skip_serializing_if = "String::is_empty"
    )]
    pub binding_uid: String,
    /// Who owns what the writer creates (rwxReadOnly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_identity: Option<WriterIdentity>,
}

/// A selection that does not parse or breaks a rule of the contract. The message names the
/// field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    /// Not a single JSON object of the contract's fields.
    #[error("storage selection does not parse: {0}")]
    Parse(String),
    /// A rule of the contract is broken.
    #[error("storage selection: {field}: {why}")]
    Invalid {
        /// The JSON field.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
}

fn invalid(field: &'static str, why: impl Into<String>) -> SelectionError {
    SelectionError::Invalid {
        field,
        why: why.into(),
    }
}

impl Selection {
    /// A non-durable selection (`none` or `ephemeral`): no resolved storage, no binding.
    pub fn non_durable(workflow: Workflow, mode: Mode) -> Self {
        Self {
            version: SELECTION_VERSION.to_owned(),
            workflow,
            mode,
            storage_class_name: String::new(),
            storage_class_uid: String::new(),
            storage_class_digest: String::new(),
            catalog_digest: String::new(),
            provider: String::new(),
            provisioner: String::new(),
            transition: None,
            required_access_modes: Vec::new(),
            required_mount_options: Vec::new(),
            encryption_required: false,
            binding_name: String::new(),
            binding_uid: String::new(),
            writer_identity: None,
        }
    }

    /// The durable selection of a binding's frozen decision, without a binding reference
    /// (add it with [`Selection::with_binding`] once the binding is stored).
    pub fn durable(
        workflow: Workflow,
        decision: &BindingDecision,
        storage_class: &BindingStorageClass,
    ) -> Self {
        Self {
            storage_class_name: storage_class.name.clone(),
            storage_class_uid: storage_class.uid.clone(),
            storage_class_digest: storage_class.configuration_digest.clone(),
            catalog_digest: decision.catalog_digest.clone(),
            provider: decision.provider.clone(),
            provisioner: decision.provisioner.clone(),
            transition: Some(decision.transition.into()),
            required_access_modes: decision.required_access_modes.clone(),
            required_mount_options: decision.required_mount_options.clone(),
            encryption_required: decision.encryption_required,
            writer_identity: decision.writer_identity,
            ..Self::non_durable(workflow, Mode::Durable)
        }
    }

    /// The same selection naming the stored binding.
    #[must_use]
    pub fn with_binding(mut self, name: impl Into<String>, uid: impl Into<String>) -> Self {
        self.binding_name = name.into();
        self.binding_uid = uid.into();
        self
    }

    /// The annotation value (compact JSON).
    pub fn to_annotation(&self) -> String {
        // A struct of strings, enums and lists always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses and validates an annotation value.
    ///
    /// # Errors
    ///
    /// [`SelectionError::Parse`] for anything but one JSON object of the contract's fields
    /// (unknown fields, a trailing value); [`SelectionError::Invalid`] for a broken rule.
    pub fn parse(value: &str) -> Result<Self, SelectionError> {
        let mut stream = serde_json::Deserializer::from_str(value).into_iter::<Selection>();
        let selection = match stream.next() {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(SelectionError::Parse(e.to_string())),
            None => return Err(SelectionError::Parse("empty value".to_owned())),
        };
        if stream.next().is_some() {
            return Err(SelectionError::Parse(
                "multiple JSON values: the annotation holds one object".to_owned(),
            ));
        }
        selection.validate()?;
        Ok(selection)
    }

    fn has_resolved_fields(&self) -> bool {
        !(self.storage_class_name.is_empty()
            && self.storage_class_uid.is_empty()
            && self.storage_class_digest.is_empty()
            && self.catalog_digest.is_empty()
            && self.provider.is_empty()
            && self.provisioner.is_empty()
            && self.transition.is_none()
            && self.required_access_modes.is_empty()
            && self.required_mount_options.is_empty()
            && self.writer_identity.is_none())
    }

    /// Checks the contract's rules.
    ///
    /// # Errors
    ///
    /// The first broken rule, naming its field.
    pub fn validate(&self) -> Result<(), SelectionError> {
        if self.version != SELECTION_VERSION {
            return Err(invalid(
                "version",
                format!("must be {SELECTION_VERSION:?}, not {:?}", self.version),
            ));
        }
        if self.mode == Mode::Ephemeral && self.workflow != Workflow::HelmModelCache {
            return Err(invalid(
                "mode",
                format!(
                    "ephemeral is only for the {} workflow",
                    Workflow::HelmModelCache.as_str()
                ),
            ));
        }
        if self.binding_name.is_empty() != self.binding_uid.is_empty() {
            return Err(invalid(
                if self.binding_name.is_empty() {
                    "bindingName"
                } else {
                    "bindingUID"
                },
                "bindingName and bindingUID are set together or not at all",
            ));
        }
        if self.mode != Mode::Durable {
            if !self.binding_name.is_empty() {
                return Err(invalid(
                    "bindingName",
                    format!("a {} selection has no binding", self.mode.as_str()),
                ));
            }
            if self.encryption_required {
                return Err(invalid(
                    "encryptionRequired",
                    format!("a {} selection is never encrypted", self.mode.as_str()),
                ));
            }
        }
        if !self.has_resolved_fields() {
            if self.mode == Mode::Durable {
                return Err(invalid(
                    "mode",
                    "a durable selection has no resolved storage",
                ));
            }
            return Ok(());
        }
        if self.storage_class_name != MODEL_CACHE_STORAGE_CLASS {
            return Err(invalid(
                "storageClassName",
                format!(
                    "must be {MODEL_CACHE_STORAGE_CLASS:?}, not {:?}",
                    self.storage_class_name
                ),
            ));
        }
        for (field, value) in [
            ("storageClassUID", &self.storage_class_uid),
            ("storageClassDigest", &self.storage_class_digest),
            ("catalogDigest", &self.catalog_digest),
            ("provider", &self.provider),
            ("provisioner", &self.provisioner),
        ] {
            if value.trim().is_empty() {
                return Err(invalid(field, "must not be blank"));
            }
        }
        let Some(transition) = self.transition else {
            return Err(invalid(
                "transition",
                "must be set with the resolved fields",
            ));
        };
        match (self.mode, transition.transition()) {
            (Mode::Durable, None) => Err(invalid(
                "transition",
                "a durable selection needs a transition other than disabled",
            )),
            (Mode::Durable, Some(t)) => {
                if self.required_access_modes != t.required_access_modes() {
                    return Err(invalid(
                        "requiredAccessModes",
                        format!(
                            "must be exactly {:?} for {}",
                            t.required_access_modes()
                                .iter()
                                .map(|m| m.as_str())
                                .collect::<Vec<_>>(),
                            t.as_str()
                        ),
                    ));
                }
                Ok(())
            }
            (_, Some(_)) => Err(invalid(
                "transition",
                format!("a {} selection has transition disabled", self.mode.as_str()),
            )),
            (_, None) if !self.required_access_modes.is_empty() => Err(invalid(
                "requiredAccessModes",
                format!("a {} selection needs no access modes", self.mode.as_str()),
            )),
            (_, None) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::v2beta1::ReclaimPolicy;

    fn decision(t: Transition) -> BindingDecision {
        BindingDecision {
            provider: "nvmesh".into(),
            provisioner: "nvmesh-csi.excelero.com".into(),
            transition: t,
            required_access_modes: t.required_access_modes().to_vec(),
            required_mount_options: vec![],
            catalog_digest: format!("sha256:{}", "a".repeat(64)),
            encryption_required: false,
            writer_identity: None,
        }
    }

    fn class() -> BindingStorageClass {
        BindingStorageClass {
            name: "nvcf-sc".into(),
            uid: "sc-uid".into(),
            reclaim_policy: ReclaimPolicy::Retain,
            configuration_digest: format!("v1:sha256:{}", "b".repeat(64)),
        }
    }

    #[test]
    fn a_durable_selection_round_trips_with_the_contract_names() {
        let s = Selection::durable(
            Workflow::HelmModelCache,
            &decision(Transition::RoxReadOnly),
            &class(),
        )
        .with_binding("mcb-x", "uid-1");
        let text = s.to_annotation();
        for name in [
            r#""version":"v1alpha1""#,
            r#""workflow":"helmModelCache""#,
            r#""mode":"durable""#,
            r#""storageClassUID":"sc-uid""#,
            r#""transition":"roxReadOnly""#,
            r#""requiredAccessModes":["ReadWriteOnce","ReadOnlyMany"]"#,
            r#""bindingName":"mcb-x""#,
            r#""bindingUID":"uid-1""#,
        ] {
            assert!(text.contains(name), "{name} in {text}");
        }
        assert!(!text.contains("encryptionRequired"), "{text}");
        assert_eq!(Selection::parse(&text).unwrap(), s);
    }

    #[test]
    fn non_durable_selections_carry_nothing_resolved() {
        let none = Selection::non_durable(Workflow::RegularModelCache, Mode::None);
        assert_eq!(
            none.to_annotation(),
            r#"{"version":"v1alpha1","workflow":"regularModelCache","mode":"none"}"#
        );
        Selection::parse(&none.to_annotation()).unwrap();
        let eph = Selection::non_durable(Workflow::HelmModelCache, Mode::Ephemeral);
        Selection::parse(&eph.to_annotation()).unwrap();
        assert_eq!(Mode::fallback(Workflow::HelmModelCache), Mode::Ephemeral);
        assert_eq!(Mode::fallback(Workflow::RegularModelCache), Mode::None);
    }

    #[test]
    fn parse_is_strict() {
        let ok = r#"{"version":"v1alpha1","workflow":"regularModelCache","mode":"none"}"#;
        Selection::parse(ok).unwrap();
        let unknown =
            r#"{"version":"v1alpha1","workflow":"regularModelCache","mode":"none","x":1}"#;
        assert!(matches!(
            Selection::parse(unknown),
            Err(SelectionError::Parse(m)) if m.contains("unknown field")
        ));
        let twice = format!("{ok} {ok}");
        assert!(matches!(
            Selection::parse(&twice),
            Err(SelectionError::Parse(m)) if m.contains("multiple JSON values")
        ));
        assert!(matches!(
            Selection::parse(""),
            Err(SelectionError::Parse(_))
        ));
        assert!(matches!(
            Selection::parse(r#"{"version":"v1alpha1","workflow":"other","mode":"none"}"#),
            Err(SelectionError::Parse(_))
        ));
    }

    fn field_of(s: &Selection) -> &'static str {
        match s.validate() {
            Err(SelectionError::Invalid { field, .. }) => field,
            other => panic!("expected a broken rule, got {other:?}"),
        }
    }

    #[test]
    fn every_rule_names_its_field() {
        let durable = || {
            Selection::durable(
                Workflow::RegularModelCache,
                &decision(Transition::RwxReadOnly),
                &class(),
            )
        };
        durable().validate().unwrap();

        let mut s = durable();
        s.version = "v1".into();
        assert_eq!(field_of(&s), "version");

        let s = Selection::non_durable(Workflow::RegularModelCache, Mode::Ephemeral);
        assert_eq!(field_of(&s), "mode");

        let mut s = durable();
        s.binding_name = "mcb-x".into();
        assert_eq!(field_of(&s), "bindingUID");
        let mut s = durable();
        s.binding_uid = "u".into();
        assert_eq!(field_of(&s), "bindingName");

        let s =
            Selection::non_durable(Workflow::RegularModelCache, Mode::None).with_binding("b", "u");
        assert_eq!(field_of(&s), "bindingName");
        let mut s = Selection::non_durable(Workflow::HelmModelCache, Mode::Ephemeral);
        s.encryption_required = true;
        assert_eq!(field_of(&s), "encryptionRequired");

        let s = Selection::non_durable(Workflow::RegularModelCache, Mode::Durable);
        assert_eq!(field_of(&s), "mode");

        let mut s = durable();
        s.storage_class_name = "other".into();
        assert_eq!(field_of(&s), "storageClassName");
        let mut s = durable();
        s.provider = " ".into();
        assert_eq!(field_of(&s), "provider");
        let mut s = durable();
        s.storage_class_uid = String::new();
        assert_eq!(field_of(&s), "storageClassUID");
        let mut s = durable();
        s.transition = None;
        assert_eq!(field_of(&s), "transition");
        let mut s = durable();
        s.transition = Some(SelectionTransition::Disabled);
        assert_eq!(field_of(&s), "transition");
        let mut s = durable();
        s.required_access_modes = vec![AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany];
        assert_eq!(field_of(&s), "requiredAccessModes");
        let mut s = Selection::durable(
            Workflow::RegularModelCache,
            &decision(Transition::RoxReadOnly),
            &class(),
        );
        s.required_access_modes.reverse();
        assert_eq!(
            field_of(&s),
            "requiredAccessModes",
            "the order is the contract's"
        );

        // none/ephemeral with resolved fields: transition disabled and no access modes.
        let mut s = durable();
        s.mode = Mode::None;
        assert_eq!(field_of(&s), "transition");
        s.transition = Some(SelectionTransition::Disabled);
        assert_eq!(field_of(&s), "requiredAccessModes");
        s.required_access_modes.clear();
        s.validate().unwrap();
    }
}
