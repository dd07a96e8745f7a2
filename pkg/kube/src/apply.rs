//! Writing children: server-side apply with one field manager per component, create-or-get,
//! ownership and management labels, and (opt-in only) pruning of orphaned children.
//!
//! - [`Applier`] server-side applies (`Patch::Apply`) with the component's field manager. Without
//!   force a field owned by another manager is a 409 conflict ([`Error::is_conflict`]); forcing
//!   ownership is an explicit call ([`Applier::force_apply`], [`Applier::force_apply_status`]).
//! - [`create_or_get`] creates an object or, when one with that name exists, returns the *stored*
//!   object as [`Created::Existing`]; it never overwrites. The caller compares and decides.
//! - [`controller_owner_reference`], [`set_controller_owner`], [`set_managed_labels`]: pure
//!   metadata stamping.
//! - [`prune::prune_unlisted`]: deletes this component's objects that were not just applied. It is
//!   **opt-in** and must never be used by model-cache components (only the reaper deletes there).

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, instrument};

use crate::error::{Error, ErrorCategory, category};

/// Label naming the tool that manages an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on every object warmcache creates.
pub const MANAGED_BY_VALUE: &str = "warmcache";
/// Label naming the warmcache component that manages an object.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";

/// Maximum length of a label value.
const MAX_LABEL_VALUE_BYTES: usize = 63;

/// How many times [`create_or_get`] tries when the object disappears between its create (409
/// AlreadyExists) and its GET (404).
const CREATE_OR_GET_ATTEMPTS: u32 = 3;

/// Server-side apply on behalf of one component (one field manager).
///
/// Without force, applying a field that another field manager owns with a different value fails
/// with 409 Conflict (classified [`ErrorCategory::Conflict`]): another writer's intent is not
/// silently overwritten. Forcing is a separate, explicit method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applier {
    field_manager: String,
}

impl Applier {
    /// An applier writing as `field_manager` (for example `warmcache-binding-controller`). Use one
    /// field manager per component and keep it stable across releases: managedFields record it.
    pub fn new(field_manager: impl Into<String>) -> Self {
        Self {
            field_manager: field_manager.into(),
        }
    }

    /// The field manager recorded in `managedFields`.
    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    fn params(&self, force: bool) -> PatchParams {
        let params = PatchParams::apply(&self.field_manager);
        if force { params.force() } else { params }
    }

    /// Server-side applies `obj` (named by its `metadata.name`) and returns the object the server
    /// stored. `obj` must carry `apiVersion` and `kind` (k8s-openapi types and derived custom
    /// resources serialize them) and only the fields this component wants to own. Applying the
    /// same object again is a no-op on the server (the resourceVersion does not change).
    pub async fn apply<K>(&self, api: &Api<K>, obj: &K) -> Result<K, Error>
    where
        K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    {
        self.apply_inner(api, obj, false).await
    }

    /// Like [`apply`](Self::apply), taking ownership of conflicting fields from other managers.
    /// Use only where this component is the sole rightful owner of every field it sends.
    pub async fn force_apply<K>(&self, api: &Api<K>, obj: &K) -> Result<K, Error>
    where
        K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    {
        self.apply_inner(api, obj, true).await
    }

    #[instrument(skip_all, fields(resource = api.resource_url(), name, field_manager = %self.field_manager, force))]
    async fn apply_inner<K>(&self, api: &Api<K>, obj: &K, force: bool) -> Result<K, Error>
    where
        K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    {
        let resource = api.resource_url();
        let name = required_name(resource, obj.meta())?;
        tracing::Span::current().record("name", name);
        api.patch(name, &self.params(force), &Patch::Apply(obj))
            .await
            .map_err(|e| Error::from_kube("apply", resource, name, e))
    }

    /// Server-side applies `status` to the status subresource of `name`. `status` is a partial
    /// object (`apiVersion`, `kind`, `status`); only the status fields it names are owned.
    pub async fn apply_status<K, S>(&self, api: &Api<K>, name: &str, status: &S) -> Result<K, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
        S: Serialize + Debug,
    {
        self.apply_status_inner(api, name, status, false).await
    }

    /// Like [`apply_status`](Self::apply_status), forcing ownership. A controller is usually the
    /// only writer of its status, so this is the common choice for status.
    pub async fn force_apply_status<K, S>(
        &self,
        api: &Api<K>,
        name: &str,
        status: &S,
    ) -> Result<K, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
        S: Serialize + Debug,
    {
        self.apply_status_inner(api, name, status, true).await
    }

    #[instrument(skip_all, fields(resource = api.resource_url(), name, field_manager = %self.field_manager, force))]
    async fn apply_status_inner<K, S>(
        &self,
        api: &Api<K>,
        name: &str,
        status: &S,
        force: bool,
    ) -> Result<K, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
        S: Serialize + Debug,
    {
        let resource = api.resource_url();
        api.patch_status(name, &self.params(force), &Patch::Apply(status))
            .await
            .map_err(|e| Error::from_kube("apply_status", resource, name, e))
    }
}

/// The result of [`create_or_get`].
#[derive(Debug, Clone, PartialEq)]
pub enum Created<K> {
    /// The object did not exist and was created; this is the server's answer.
    Created(K),
    /// An object with that name already existed; this is the object as stored (not the one the
    /// caller asked to create). Compare it with what you wanted and decide.
    Existing(K),
}

impl<K> Created<K> {
    /// The object, whichever way it was obtained.
    pub fn into_inner(self) -> K {
        match self {
            Self::Created(k) | Self::Existing(k) => k,
        }
    }

    /// The object, whichever way it was obtained.
    pub fn object(&self) -> &K {
        match self {
            Self::Created(k) | Self::Existing(k) => k,
        }
    }

    /// True when this call created the object.
    pub fn was_created(&self) -> bool {
        matches!(self, Self::Created(_))
    }
}

/// Creates `obj` (named by its `metadata.name`; `generateName` is not supported). When an object
/// of that name exists (409 AlreadyExists), reads it and returns it as [`Created::Existing`]:
/// nothing is overwritten. If the existing object is deleted between the create and the read,
/// the create is tried again (at most 3 attempts in all).
#[instrument(skip_all, fields(resource = api.resource_url(), name))]
pub async fn create_or_get<K>(api: &Api<K>, obj: &K) -> Result<Created<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let resource = api.resource_url();
    let name = required_name(resource, obj.meta())?;
    tracing::Span::current().record("name", name);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match api.create(&PostParams::default(), obj).await {
            Ok(created) => return Ok(Created::Created(created)),
            Err(e) if category(&e) == ErrorCategory::AlreadyExists => {}
            Err(e) => return Err(Error::from_kube("create", resource, name, e)),
        }
        match api.get(name).await {
            Ok(existing) => return Ok(Created::Existing(existing)),
            Err(e)
                if category(&e) == ErrorCategory::NotFound && attempt < CREATE_OR_GET_ATTEMPTS =>
            {
                debug!(
                    resource,
                    name, attempt, "existing object vanished before it was read; creating again"
                );
            }
            Err(e) => return Err(Error::from_kube("get", resource, name, e)),
        }
    }
}

fn required_name<'a>(resource: &str, meta: &'a ObjectMeta) -> Result<&'a str, Error> {
    meta.name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::MissingName {
            resource: resource.to_owned(),
        })
}

/// Why metadata could not be stamped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// The owner has no `metadata.name` or `metadata.uid`: it was not read from the API server.
    #[error("the owner {kind} {name:?} has no {missing}; owner references need a stored owner")]
    OwnerNotStored {
        /// Kind of the owner.
        kind: String,
        /// Name of the owner, if any.
        name: Option<String>,
        /// `metadata.name` or `metadata.uid`.
        missing: &'static str,
    },
    /// The object already has a controller reference to another owner. An object has at most one
    /// controller; replacing it would be a takeover, which this helper refuses.
    #[error(
        "already controlled by {existing_kind} {existing_name} (uid {existing_uid}); refusing to \
         set {kind} {name} as its controller"
    )]
    OtherController {
        /// Kind of the current controller.
        existing_kind: String,
        /// Name of the current controller.
        existing_name: String,
        /// UID of the current controller.
        existing_uid: String,
        /// Kind of the requested controller.
        kind: String,
        /// Name of the requested controller.
        name: String,
    },
    /// The component name is not a valid label value (at most 63 characters, alphanumerics, `-`,
    /// `_`, `.`, beginning and ending with an alphanumeric).
    #[error("component name {0:?} is not a valid label value")]
    InvalidComponent(String),
}

/// A controller owner reference to `owner`: `controller: true`, `blockOwnerDeletion: true`.
///
/// `blockOwnerDeletion` is true, as the built-in controllers set it: with foreground deletion of
/// the owner, the owner stays until this child is gone, so "owner deleted" implies "children
/// deleted". Where the `OwnerReferencesPermissionEnforcement` admission plugin is enabled, setting
/// it requires `update` on the owner's `finalizers` subresource; grant that in the component's
/// RBAC.
pub fn controller_owner_reference<O>(owner: &O) -> Result<OwnerReference, MetadataError>
where
    O: Resource<DynamicType = ()>,
{
    let meta = owner.meta();
    let kind = O::kind(&()).into_owned();
    let not_stored = |missing| MetadataError::OwnerNotStored {
        kind: kind.clone(),
        name: meta.name.clone(),
        missing,
    };
    let name = meta
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| not_stored("metadata.name"))?;
    let uid = meta
        .uid
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| not_stored("metadata.uid"))?;
    Ok(OwnerReference {
        api_version: O::api_version(&()).into_owned(),
        kind: kind.clone(),
        name,
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Puts `reference` (a controller reference, see [`controller_owner_reference`]) on `meta`.
///
/// Idempotent: a reference with the same UID is replaced by `reference`; other non-controller
/// references are kept. Fails with [`MetadataError::OtherController`] when another owner (other
/// UID) is already the controller.
pub fn set_controller_owner(
    meta: &mut ObjectMeta,
    reference: OwnerReference,
) -> Result<(), MetadataError> {
    let refs = meta.owner_references.get_or_insert_with(Vec::new);
    if let Some(other) = refs
        .iter()
        .find(|r| r.controller == Some(true) && r.uid != reference.uid)
    {
        return Err(MetadataError::OtherController {
            existing_kind: other.kind.clone(),
            existing_name: other.name.clone(),
            existing_uid: other.uid.clone(),
            kind: reference.kind,
            name: reference.name,
        });
    }
    refs.retain(|r| r.uid != reference.uid);
    refs.push(reference);
    Ok(())
}

/// Sets `app.kubernetes.io/managed-by=warmcache` and `app.kubernetes.io/component=<component>`
/// on `meta`, keeping every other label.
pub fn set_managed_labels(meta: &mut ObjectMeta, component: &str) -> Result<(), MetadataError> {
    if !is_label_value(component) || component.is_empty() {
        return Err(MetadataError::InvalidComponent(component.to_owned()));
    }
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
    labels.insert(COMPONENT_LABEL.to_owned(), component.to_owned());
    Ok(())
}

/// The label selector matching objects managed by `component`
/// (`app.kubernetes.io/managed-by=warmcache,app.kubernetes.io/component=<component>`).
pub fn managed_selector(component: &str) -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{COMPONENT_LABEL}={component}")
}

/// True when `labels` carry the managed-by label and the component label of `component`.
pub fn is_managed_by(labels: &BTreeMap<String, String>, component: &str) -> bool {
    labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE)
        && labels.get(COMPONENT_LABEL).map(String::as_str) == Some(component)
}

fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let ok_char = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    bytes.len() <= MAX_LABEL_VALUE_BYTES
        && bytes.iter().all(ok_char)
        && bytes.first().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.last().is_none_or(u8::is_ascii_alphanumeric)
}

/// Opt-in deletion of a component's orphaned children.
///
/// **Model-cache components must never use this module.** In the model cache only the reaper
/// deletes, by its own named rules; drift never authorizes deletion there. This is for components
/// such as the KV-cache tier operator whose children are fully derived from one custom resource.
pub mod prune {
    use std::collections::BTreeSet;
    use std::fmt::Debug;

    use kube::api::{Api, DeleteParams, ListParams, Preconditions};
    use kube::{Resource, ResourceExt};
    use serde::de::DeserializeOwned;
    use tracing::{debug, instrument};

    use super::{is_managed_by, managed_selector};
    use crate::error::{Error, ErrorCategory, category};

    /// Page size of the list made by [`prune_unlisted`].
    const PAGE_SIZE: u32 = 500;

    /// What [`prune_unlisted`] did.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Pruned {
        /// Names deleted by this call (or already gone when deleted: NotFound counts as success).
        pub deleted: Vec<String>,
        /// Names skipped because the object was replaced (another UID) between list and delete.
        pub replaced: Vec<String>,
        /// Number of listed objects kept because they are in the keep set.
        pub kept: usize,
    }

    /// Deletes every object of `api` that `component` manages, that matches `selector` (extra
    /// label selector terms such as `app.kubernetes.io/instance=x`; may be empty), and whose name
    /// is not in `keep` (the names just applied).
    ///
    /// Only objects that carry both `app.kubernetes.io/managed-by=warmcache` and
    /// `app.kubernetes.io/component=<component>` are ever deleted: the selector is narrowed to
    /// them on the server and checked again on each listed object. Objects already being deleted
    /// are left alone. Each delete is conditional on the listed UID, so an object recreated under
    /// the same name meanwhile is not deleted (reported in [`Pruned::replaced`]). A 404 on delete
    /// is success.
    ///
    /// **Never use this from a model-cache component: only the reaper deletes.**
    #[instrument(skip_all, fields(resource = api.resource_url(), component, selector))]
    pub async fn prune_unlisted<K>(
        api: &Api<K>,
        component: &str,
        selector: &str,
        keep: &BTreeSet<String>,
    ) -> Result<Pruned, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        let resource = api.resource_url();
        let mut full = managed_selector(component);
        if !selector.trim().is_empty() {
            full.push(',');
            full.push_str(selector.trim());
        }
        let mut candidates = Vec::new();
        let mut kept = 0;
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().labels(&full).limit(PAGE_SIZE);
            if let Some(token) = token.as_deref() {
                params = params.continue_token(token);
            }
            let page = api.list(&params).await.map_err(|e| Error::List {
                resource: resource.to_owned(),
                selector: full.clone(),
                category: category(&e),
                source: Box::new(e),
            })?;
            for obj in page.items {
                let name = obj.name_any();
                if keep.contains(&name) {
                    kept += 1;
                } else if is_managed_by(obj.labels(), component)
                    && obj.meta().deletion_timestamp.is_none()
                {
                    candidates.push((name, obj.uid()));
                }
            }
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
        }

        let mut pruned = Pruned {
            kept,
            ..Pruned::default()
        };
        for (name, uid) in candidates {
            let params = DeleteParams::background().preconditions(Preconditions {
                uid,
                resource_version: None,
            });
            match api.delete(&name, &params).await {
                Ok(_) => pruned.deleted.push(name),
                Err(e) if category(&e) == ErrorCategory::NotFound => pruned.deleted.push(name),
                Err(e) if category(&e) == ErrorCategory::Conflict => {
                    debug!(
                        resource,
                        name, "object was replaced since the list; not pruned"
                    );
                    pruned.replaced.push(name);
                }
                Err(e) => return Err(Error::from_kube("delete", resource, &name, e)),
            }
        }
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn stored_deployment(name: &str, uid: &str) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..Deployment::default()
        }
    }

    #[test]
    fn controller_reference_points_at_the_stored_owner() {
        let r = controller_owner_reference(&stored_deployment("web", "u-1")).unwrap();
        assert_eq!(r.api_version, "apps/v1");
        assert_eq!(r.kind, "Deployment");
        assert_eq!(r.name, "web");
        assert_eq!(r.uid, "u-1");
        assert_eq!(r.controller, Some(true));
        assert_eq!(r.block_owner_deletion, Some(true));

        let mut unsaved = stored_deployment("web", "");
        let err = controller_owner_reference(&unsaved).unwrap_err();
        assert!(matches!(
            err,
            MetadataError::OwnerNotStored {
                missing: "metadata.uid",
                ..
            }
        ));
        unsaved.metadata.name = None;
        let err = controller_owner_reference(&unsaved).unwrap_err();
        assert!(matches!(
            err,
            MetadataError::OwnerNotStored {
                missing: "metadata.name",
                ..
            }
        ));
    }

    #[test]
    fn set_controller_owner_is_idempotent_and_refuses_takeover() {
        let mut meta = ObjectMeta::default();
        let plain = OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "other".into(),
            uid: "u-x".into(),
            ..OwnerReference::default()
        };
        meta.owner_references = Some(vec![plain.clone()]);
        let r = controller_owner_reference(&stored_deployment("web", "u-1")).unwrap();
        set_controller_owner(&mut meta, r.clone()).unwrap();
        set_controller_owner(&mut meta, r.clone()).unwrap();
        assert_eq!(meta.owner_references, Some(vec![plain, r]));

        let other = controller_owner_reference(&stored_deployment("db", "u-2")).unwrap();
        let err = set_controller_owner(&mut meta, other).unwrap_err();
        assert!(
            matches!(&err, MetadataError::OtherController { existing_uid, name, .. } if existing_uid == "u-1" && name == "db"),
            "{err}"
        );
    }

    #[test]
    fn managed_labels_keep_other_labels() {
        let mut cm = ConfigMap::default();
        cm.metadata.labels = Some(BTreeMap::from([("app".into(), "x".into())]));
        set_managed_labels(&mut cm.metadata, "kvcache-operator").unwrap();
        let labels = cm.metadata.labels.clone().unwrap();
        assert_eq!(labels["app"], "x");
        assert_eq!(labels[MANAGED_BY_LABEL], "warmcache");
        assert_eq!(labels[COMPONENT_LABEL], "kvcache-operator");
        assert!(is_managed_by(&labels, "kvcache-operator"));
        assert!(!is_managed_by(&labels, "reaper"));
        assert!(!is_managed_by(&BTreeMap::new(), "kvcache-operator"));
        assert_eq!(
            managed_selector("reaper"),
            "app.kubernetes.io/managed-by=warmcache,app.kubernetes.io/component=reaper"
        );

        for bad in ["", "-x", "x-", "a b", "a/b", &"x".repeat(64)] {
            assert_eq!(
                set_managed_labels(&mut cm.metadata, bad),
                Err(MetadataError::InvalidComponent(bad.to_owned())),
                "{bad:?}"
            );
        }
        assert!(set_managed_labels(&mut cm.metadata, &"x".repeat(63)).is_ok());
    }

    #[test]
    fn created_accessors() {
        let c = Created::Created(1);
        assert!(c.was_created());
        assert_eq!(*c.object(), 1);
        let e = Created::Existing(2);
        assert!(!e.was_created());
        assert_eq!(e.into_inner(), 2);
    }

    #[test]
    fn apply_needs_a_name() {
        let meta = ObjectMeta::default();
        let err = required_name("/api/v1/namespaces/a/configmaps", &meta);
        assert!(matches!(err, Err(Error::MissingName { .. })));
    }
}
