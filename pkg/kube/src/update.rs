//! Conflict-aware read-decide-write updates.
//!
//! Every write that matters carries the resourceVersion of the state it was decided from. When
//! the API server answers 409 Conflict, somebody else changed the object in between: the helpers
//! here re-read it and ask the caller's decision function again, with the fresh object, instead of
//! overwriting the other writer's change. The number of attempts is bounded.

use std::fmt::Debug;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::debug;

use crate::error::{Error, ErrorCategory, category};

/// What a decision function wants done with the object it was shown.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<K> {
    /// Write this object. It must be derived from the object the function was given: its
    /// `metadata.resourceVersion` must be unset (it is then filled in) or equal to the given one.
    Update(K),
    /// Nothing to change; no write is made.
    Unchanged,
    /// Do not write, and fail with [`Error::Aborted`] carrying this reason (for example "the
    /// object is being deleted" or "the completion labels are not stored yet").
    Abort(String),
}

/// The successful result of [`update_with_retry`] / [`update_status_with_retry`].
#[derive(Debug, Clone, PartialEq)]
pub enum Updated<K> {
    /// The object was written; this is the server's answer (with the new resourceVersion).
    Written(K),
    /// The decision function asked for no change; this is the object as last read.
    Unchanged(K),
}

impl<K> Updated<K> {
    /// The object, whether or not a write happened.
    pub fn into_inner(self) -> K {
        match self {
            Self::Written(k) | Self::Unchanged(k) => k,
        }
    }

    /// The object, whether or not a write happened.
    pub fn object(&self) -> &K {
        match self {
            Self::Written(k) | Self::Unchanged(k) => k,
        }
    }

    /// True when a write was made.
    pub fn was_written(&self) -> bool {
        matches!(self, Self::Written(_))
    }
}

/// How often and how fast a conflicting write is retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Maximum number of writes (the first one included). At least 1.
    pub max_attempts: u32,
    /// Delay before the first retry; later delays grow exponentially, with jitter.
    pub min_delay: Duration,
    /// Upper bound of a single delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts, delays from 10 ms up to 500 ms with jitter.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            min_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// The jittered delays between attempts (`max_attempts - 1` of them).
    pub(crate) fn delays(&self) -> impl Iterator<Item = Duration> {
        let retries = self.max_attempts.saturating_sub(1) as usize;
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_jitter()
            .with_max_times(retries)
            .build()
    }
}

/// Which endpoint a write goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Object,
    Status,
}

impl Target {
    fn verb(self) -> &'static str {
        match self {
            Self::Object => "replace",
            Self::Status => "replace_status",
        }
    }
}

/// Reads `name`, asks `decide` what to do with it and, for [`Decision::Update`], replaces the
/// object (PUT) conditionally on the resourceVersion that was read. On 409 Conflict the object is
/// read again and `decide` is called again with the fresh state; after
/// [`RetryPolicy::default`]`.max_attempts` conflicting writes the result is
/// [`Error::ConflictRetriesExhausted`].
///
/// `decide` receives the object by reference and may be called several times; it must decide from
/// what it is shown, not from state captured earlier.
///
/// Errors other than a conflict are returned at once: 404 as [`Error::NotFound`], anything else as
/// [`Error::Api`] (with its [`ErrorCategory`]).
pub async fn update_with_retry<K, F>(
    api: &Api<K>,
    name: &str,
    decide: F,
) -> Result<Updated<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    F: FnMut(&K) -> Decision<K>,
{
    update_inner(api, name, &RetryPolicy::default(), Target::Object, decide).await
}

/// [`update_with_retry`] with an explicit [`RetryPolicy`].
pub async fn update_with_retry_policy<K, F>(
    api: &Api<K>,
    name: &str,
    policy: &RetryPolicy,
    decide: F,
) -> Result<Updated<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    F: FnMut(&K) -> Decision<K>,
{
    update_inner(api, name, policy, Target::Object, decide).await
}

/// Like [`update_with_retry`], but the write is a PUT to the `/status` subresource
/// ([`Api::replace_status`]): only the status of the returned object is stored, and the
/// resourceVersion precondition applies the same way.
pub async fn update_status_with_retry<K, F>(
    api: &Api<K>,
    name: &str,
    decide: F,
) -> Result<Updated<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    F: FnMut(&K) -> Decision<K>,
{
    update_inner(api, name, &RetryPolicy::default(), Target::Status, decide).await
}

/// [`update_status_with_retry`] with an explicit [`RetryPolicy`].
pub async fn update_status_with_retry_policy<K, F>(
    api: &Api<K>,
    name: &str,
    policy: &RetryPolicy,
    decide: F,
) -> Result<Updated<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    F: FnMut(&K) -> Decision<K>,
{
    update_inner(api, name, policy, Target::Status, decide).await
}

async fn update_inner<K, F>(
    api: &Api<K>,
    name: &str,
    policy: &RetryPolicy,
    target: Target,
    mut decide: F,
) -> Result<Updated<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    F: FnMut(&K) -> Decision<K>,
{
    let resource = api.resource_url();
    let max_attempts = policy.max_attempts.max(1);
    let mut delays = policy.delays();
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let current = api
            .get(name)
            .await
            .map_err(|e| Error::from_kube("get", resource, name, e))?;
        let mut new = match decide(&current) {
            Decision::Unchanged => return Ok(Updated::Unchanged(current)),
            Decision::Abort(reason) => {
                return Err(Error::Aborted {
                    resource: resource.to_owned(),
                    name: name.to_owned(),
                    reason,
                });
            }
            Decision::Update(new) => new,
        };
        let expected = precondition(resource, name, &current, &new)?;
        new.meta_mut().resource_version = Some(expected);

        let written = match target {
            Target::Object => api.replace(name, &PostParams::default(), &new).await,
            Target::Status => api.replace_status(name, &PostParams::default(), &new).await,
        };
        match written {
            Ok(obj) => return Ok(Updated::Written(obj)),
            Err(e) if category(&e) == ErrorCategory::Conflict => {
                if attempt >= max_attempts {
                    return Err(Error::ConflictRetriesExhausted {
                        resource: resource.to_owned(),
                        name: name.to_owned(),
                        attempts: attempt,
                        source: Box::new(e),
                    });
                }
                let delay = delays.next().unwrap_or(policy.max_delay);
                debug!(
                    resource,
                    name,
                    attempt,
                    delay_ms = delay.as_millis() as u64,
                    "write conflicted; re-reading and deciding again"
                );
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(Error::from_kube(target.verb(), resource, name, e)),
        }
    }
}

/// Checks that `new` was derived from `current` and returns the resourceVersion the write must
/// be conditional on.
fn precondition<K: Resource>(
    resource: &str,
    name: &str,
    current: &K,
    new: &K,
) -> Result<String, Error> {
    let expected = current
        .resource_version()
        .filter(|rv| !rv.is_empty())
        .ok_or_else(|| Error::MissingResourceVersion {
            resource: resource.to_owned(),
            name: name.to_owned(),
        })?;
    match new.meta().resource_version.as_deref() {
        None | Some("") => Ok(expected),
        Some(found) if found == expected => Ok(expected),
        Some(found) => Err(Error::ResourceVersionMismatch {
            resource: resource.to_owned(),
            name: name.to_owned(),
            expected,
            found: found.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(rv: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("x".into()),
                resource_version: rv.map(str::to_owned),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn precondition_fills_in_missing_resource_version() {
        let rv = precondition("/r", "x", &cm(Some("7")), &cm(None)).unwrap();
        assert_eq!(rv, "7");
        let rv = precondition("/r", "x", &cm(Some("7")), &cm(Some(""))).unwrap();
        assert_eq!(rv, "7");
        let rv = precondition("/r", "x", &cm(Some("7")), &cm(Some("7"))).unwrap();
        assert_eq!(rv, "7");
    }

    #[test]
    fn precondition_refuses_unconditional_or_foreign_writes() {
        let err = precondition("/r", "x", &cm(None), &cm(None)).unwrap_err();
        assert!(matches!(err, Error::MissingResourceVersion { .. }));
        let err = precondition("/r", "x", &cm(Some("")), &cm(None)).unwrap_err();
        assert!(matches!(err, Error::MissingResourceVersion { .. }));
        let err = precondition("/r", "x", &cm(Some("7")), &cm(Some("6"))).unwrap_err();
        assert!(matches!(err, Error::ResourceVersionMismatch { .. }));
    }

    #[test]
    fn retry_policy_yields_bounded_jittered_delays() {
        let policy = RetryPolicy::default();
        let delays: Vec<_> = policy.delays().collect();
        assert_eq!(delays.len(), 4);
        for d in delays {
            assert!(d >= policy.min_delay, "{d:?}");
            assert!(d <= policy.max_delay * 2, "{d:?}");
        }
        let one = RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        };
        assert_eq!(one.delays().count(), 0);
    }

    #[test]
    fn updated_accessors() {
        let w = Updated::Written(1);
        assert!(w.was_written());
        assert_eq!(*w.object(), 1);
        let u = Updated::Unchanged(2);
        assert!(!u.was_written());
        assert_eq!(u.into_inner(), 2);
    }
}
