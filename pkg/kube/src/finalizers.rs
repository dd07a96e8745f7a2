//! Adding and removing finalizers without losing concurrent edits.
//!
//! Both helpers send a JSON patch whose first operation is a `test`:
//! - when the object already has finalizers, the test asserts the whole `metadata.finalizers`
//!   array is exactly what we saw, so a finalizer added or removed by someone else in between
//!   makes the patch fail instead of being overwritten; unrelated edits (status, labels) do not
//!   disturb it;
//! - when it has none, the test asserts `metadata.resourceVersion` (there is no array to test).
//!
//! A failed test is answered by the API server with 422. The helper then re-reads the object: if
//! the guarded state did change, it plans again from the fresh object (which may now be a no-op)
//! and retries, a bounded number of times; if it did not change, the 422 was a genuine rejection
//! and is returned.
//!
//! Both helpers are idempotent: adding a finalizer that is present or removing one that is absent
//! makes no API call and returns the object as given.

use std::borrow::Cow;
use std::fmt::Debug;

use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::debug;

use crate::error::{Error, ErrorCategory, category};
use crate::update::RetryPolicy;

/// Whether `obj` carries the finalizer `finalizer`.
pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// What a planned patch was conditioned on; used to tell a failed `test` from a real rejection.
#[derive(Debug, Clone, PartialEq)]
enum Guard {
    /// The exact finalizers array.
    Finalizers(Vec<String>),
    /// The resourceVersion (the object had no finalizers).
    ResourceVersion(String),
}

impl Guard {
    /// Whether `meta` no longer matches what the patch was tested against.
    fn changed(&self, meta: &ObjectMeta) -> bool {
        match self {
            Self::Finalizers(seen) => current_finalizers(meta) != seen.as_slice(),
            Self::ResourceVersion(rv) => meta.resource_version.as_deref() != Some(rv.as_str()),
        }
    }
}

#[derive(Debug)]
struct Plan {
    patch: json_patch::Patch,
    guard: Guard,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Add,
    Remove,
}

fn current_finalizers(meta: &ObjectMeta) -> &[String] {
    meta.finalizers.as_deref().unwrap_or_default()
}

/// Plans the patch for `op`; `Ok(None)` when nothing needs to change.
fn plan(meta: &ObjectMeta, op: Op, finalizer: &str) -> Result<Option<Plan>, PlanError> {
    let existing = current_finalizers(meta);
    let present = existing.iter().any(|f| f == finalizer);
    let value = match (op, present) {
        (Op::Add, true) | (Op::Remove, false) => return Ok(None),
        (Op::Add, false) if existing.is_empty() => {
            let rv = meta
                .resource_version
                .clone()
                .filter(|rv| !rv.is_empty())
                .ok_or(PlanError::MissingResourceVersion)?;
            let value = json!([
                { "op": "test", "path": "/metadata/resourceVersion", "value": rv },
                { "op": "add", "path": "/metadata/finalizers", "value": [finalizer] },
            ]);
            return Ok(Some(Plan {
                patch: serde_json::from_value(value).map_err(PlanError::Json)?,
                guard: Guard::ResourceVersion(rv),
            }));
        }
        (Op::Add, false) => json!([
            { "op": "test", "path": "/metadata/finalizers", "value": existing },
            { "op": "add", "path": "/metadata/finalizers/-", "value": finalizer },
        ]),
        (Op::Remove, true) => {
            // Remove every copy (duplicates are legal, if odd), from the back so indices stay valid.
            let mut ops =
                vec![json!({ "op": "test", "path": "/metadata/finalizers", "value": existing })];
            for (i, _) in existing
                .iter()
                .enumerate()
                .rev()
                .filter(|(_, f)| *f == finalizer)
            {
                ops.push(json!({ "op": "remove", "path": format!("/metadata/finalizers/{i}") }));
            }
            serde_json::Value::Array(ops)
        }
    };
    Ok(Some(Plan {
        patch: serde_json::from_value(value).map_err(PlanError::Json)?,
        guard: Guard::Finalizers(existing.to_vec()),
    }))
}

#[derive(Debug)]
enum PlanError {
    MissingResourceVersion,
    Json(serde_json::Error),
}

/// Adds `finalizer` to `obj` and returns the updated object (or `obj` itself, unchanged, if the
/// finalizer is already there).
///
/// The write is a JSON patch guarded by a `test` (see the module docs), retried from a fresh read
/// when a concurrent edit made the test fail. Note that the API server refuses new finalizers on
/// an object that is already being deleted.
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    patch_finalizers(api, obj, Op::Add, finalizer).await
}

/// Removes `finalizer` from `obj` and returns the updated object (or `obj` itself, unchanged, if
/// the finalizer is not there). Removing the last finalizer of an object being deleted lets the
/// API server delete it; the returned object is then its final state.
///
/// If the object no longer exists the result is [`Error::NotFound`], which callers cleaning up
/// may treat as done.
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    patch_finalizers(api, obj, Op::Remove, finalizer).await
}

async fn patch_finalizers<K>(api: &Api<K>, obj: &K, op: Op, finalizer: &str) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let resource = api.resource_url();
    let name = obj.name_any();
    let policy = RetryPolicy::default();
    let mut delays = policy.delays();
    let mut current: Cow<'_, K> = Cow::Borrowed(obj);
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let plan = match plan(current.meta(), op, finalizer) {
            Ok(Some(plan)) => plan,
            Ok(None) => return Ok(current.into_owned()),
            Err(PlanError::MissingResourceVersion) => {
                return Err(Error::MissingResourceVersion {
                    resource: resource.to_owned(),
                    name,
                });
            }
            Err(PlanError::Json(source)) => {
                return Err(Error::BuildPatch {
                    resource: resource.to_owned(),
                    name,
                    source,
                });
            }
        };
        let patch: Patch<()> = Patch::Json(plan.patch);
        let err = match api.patch(&name, &PatchParams::default(), &patch).await {
            Ok(updated) => return Ok(updated),
            Err(err) => err,
        };
        // A failed `test` comes back as 422; a conflict inside the server as 409. Anything
        // else is final.
        if !matches!(
            category(&err),
            ErrorCategory::Invalid | ErrorCategory::Conflict
        ) {
            return Err(Error::from_kube("patch", resource, &name, err));
        }
        let fresh = api
            .get(&name)
            .await
            .map_err(|e| Error::from_kube("get", resource, &name, e))?;
        if !plan.guard.changed(fresh.meta()) {
            // Nothing we tested against moved: the rejection is genuine.
            return Err(Error::from_kube("patch", resource, &name, err));
        }
        if attempt >= policy.max_attempts {
            return Err(Error::ConflictRetriesExhausted {
                resource: resource.to_owned(),
                name,
                attempts: attempt,
                source: Box::new(err),
            });
        }
        debug!(
            resource,
            name,
            attempt,
            ?op,
            finalizer,
            "finalizers changed concurrently; planning again"
        );
        current = Cow::Owned(fresh);
        if let Some(delay) = delays.next() {
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::Value;

    fn meta(finalizers: Option<&[&str]>, rv: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some("x".into()),
            resource_version: rv.map(str::to_owned),
            finalizers: finalizers.map(|f| f.iter().map(|s| (*s).to_owned()).collect()),
            ..Default::default()
        }
    }

    fn ops(plan: &Plan) -> Value {
        serde_json::to_value(&plan.patch).unwrap()
    }

    #[test]
    fn has_finalizer_checks_the_list() {
        let cm = ConfigMap {
            metadata: meta(Some(&["a", "b"]), Some("1")),
            ..Default::default()
        };
        assert!(has_finalizer(&cm, "a"));
        assert!(!has_finalizer(&cm, "c"));
        assert!(!has_finalizer(&ConfigMap::default(), "a"));
    }

    #[test]
    fn add_to_empty_tests_resource_version() {
        let p = plan(&meta(None, Some("5")), Op::Add, "x.io/f")
            .unwrap()
            .unwrap();
        assert_eq!(
            ops(&p),
            json!([
                { "op": "test", "path": "/metadata/resourceVersion", "value": "5" },
                { "op": "add", "path": "/metadata/finalizers", "value": ["x.io/f"] },
            ])
        );
        assert_eq!(p.guard, Guard::ResourceVersion("5".into()));
        // An empty array is the same as none.
        let p = plan(&meta(Some(&[]), Some("5")), Op::Add, "x.io/f")
            .unwrap()
            .unwrap();
        assert_eq!(p.guard, Guard::ResourceVersion("5".into()));
    }

    #[test]
    fn add_to_empty_without_resource_version_is_refused() {
        assert!(matches!(
            plan(&meta(None, None), Op::Add, "f"),
            Err(PlanError::MissingResourceVersion)
        ));
    }

    #[test]
    fn add_to_existing_tests_the_array() {
        let p = plan(&meta(Some(&["a"]), Some("5")), Op::Add, "b")
            .unwrap()
            .unwrap();
        assert_eq!(
            ops(&p),
            json!([
                { "op": "test", "path": "/metadata/finalizers", "value": ["a"] },
                { "op": "add", "path": "/metadata/finalizers/-", "value": "b" },
            ])
        );
    }

    #[test]
    fn no_ops_make_no_plan() {
        assert!(
            plan(&meta(Some(&["a"]), Some("5")), Op::Add, "a")
                .unwrap()
                .is_none()
        );
        assert!(
            plan(&meta(Some(&["a"]), Some("5")), Op::Remove, "b")
                .unwrap()
                .is_none()
        );
        assert!(plan(&meta(None, None), Op::Remove, "b").unwrap().is_none());
    }

    #[test]
    fn remove_tests_the_array_and_removes_every_copy_from_the_back() {
        let p = plan(&meta(Some(&["f", "a", "f"]), Some("5")), Op::Remove, "f")
            .unwrap()
            .unwrap();
        assert_eq!(
            ops(&p),
            json!([
                { "op": "test", "path": "/metadata/finalizers", "value": ["f", "a", "f"] },
                { "op": "remove", "path": "/metadata/finalizers/2" },
                { "op": "remove", "path": "/metadata/finalizers/0" },
            ])
        );
    }

    #[test]
    fn guard_detects_relevant_changes_only() {
        let g = Guard::Finalizers(vec!["a".into()]);
        assert!(!g.changed(&meta(Some(&["a"]), Some("9"))));
        assert!(g.changed(&meta(Some(&["a", "b"]), Some("9"))));
        assert!(g.changed(&meta(None, Some("9"))));
        let g = Guard::ResourceVersion("5".into());
        assert!(!g.changed(&meta(None, Some("5"))));
        assert!(g.changed(&meta(None, Some("6"))));
    }
}
