//! A fresh namespace per test.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use crate::plane::random_suffix;
use crate::{ControlPlane, TestkitError, eventually};

/// Label put on every namespace the kit creates (value `"true"`), to find leftovers.
pub const TESTKIT_NAMESPACE_LABEL: &str = "warmcache.io/testkit";

const DEFAULT_SA_TIMEOUT: Duration = Duration::from_secs(60);
const DELETE_TIMEOUT: Duration = Duration::from_secs(60);

/// A namespace created for one test on the shared [`ControlPlane`], with an admin client bound to
/// the calling test's runtime.
///
/// The name is `t-<prefix>-<random>` (the prefix is lowercased and cut to stay a DNS label). The
/// namespace is ready for pods: [`TestNamespace::new`] waits until the `default` ServiceAccount
/// exists, which the `ServiceAccount` admission plugin requires.
#[derive(Clone)]
pub struct TestNamespace {
    /// The namespace name.
    pub name: String,
    /// A fresh admin client (not shared with other tests).
    pub client: Client,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TestNamespace {
    /// Creates a namespace `t-<prefix>-<random>` on the shared control plane and waits until its
    /// `default` ServiceAccount exists.
    pub async fn new(prefix: &str) -> Result<TestNamespace, TestkitError> {
        let plane = ControlPlane::shared().await?;
        let client = plane.client().await?;
        Self::create_with(client, prefix).await
    }

    /// Like [`new`](Self::new), with a client of the caller's choosing (for example one from
    /// [`ControlPlane::client_with_faults`]).
    pub async fn create_with(client: Client, prefix: &str) -> Result<TestNamespace, TestkitError> {
        Self::create_labelled(client, prefix, &[]).await
    }

    /// Like [`new`](Self::new), with `labels` on the namespace from its creation (a webhook's
    /// namespace selector or opt-out label holds for its first pod).
    pub async fn with_labels(
        prefix: &str,
        labels: &[(&str, &str)],
    ) -> Result<TestNamespace, TestkitError> {
        let plane = ControlPlane::shared().await?;
        let client = plane.client().await?;
        Self::create_labelled(client, prefix, labels).await
    }

    async fn create_labelled(
        client: Client,
        prefix: &str,
        labels: &[(&str, &str)],
    ) -> Result<TestNamespace, TestkitError> {
        let name = namespace_name(prefix);
        let mut all = BTreeMap::from([(TESTKIT_NAMESPACE_LABEL.to_owned(), "true".to_owned())]);
        all.extend(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(all),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .map_err(|e| TestkitError::kube(format!("creating namespace {name}"), e))?;
        let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        eventually(
            &format!("ServiceAccount {name}/default (created by kube-controller-manager)"),
            DEFAULT_SA_TIMEOUT,
            || {
                let service_accounts = service_accounts.clone();
                async move { service_accounts.get_opt("default").await.ok().flatten() }
            },
        )
        .await?;
        Ok(TestNamespace { name, client })
    }

    /// A typed API for namespaced resources in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// A namespace selector matching only this namespace (via the `kubernetes.io/metadata.name`
    /// label the API server sets), for scoping webhooks registered by a test.
    pub fn selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                self.name.clone(),
            )])),
            ..LabelSelector::default()
        }
    }

    /// Deletes the namespace (best effort; errors are logged, not returned) without waiting for
    /// the namespace controller to finish.
    pub async fn cleanup(self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        if let Err(e) = namespaces
            .delete(&self.name, &DeleteParams::background())
            .await
        {
            tracing::warn!(namespace = %self.name, error = %e, "deleting test namespace failed");
        }
    }

    /// Deletes the namespace and waits until it is gone, which proves the namespace controller
    /// finished (all contents deleted, finalizers cleared).
    pub async fn delete_and_wait(self) -> Result<(), TestkitError> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        match namespaces
            .delete(&self.name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(e) => {
                return Err(TestkitError::kube(
                    format!("deleting namespace {}", self.name),
                    e,
                ));
            }
        }
        let name = self.name.clone();
        eventually(
            &format!("namespace {name} to be deleted"),
            DELETE_TIMEOUT,
            || {
                let namespaces = namespaces.clone();
                let name = name.clone();
                async move {
                    match namespaces.get_opt(&name).await {
                        Ok(None) => Some(()),
                        _ => None,
                    }
                }
            },
        )
        .await
    }
}

/// `t-<prefix>-<6 random>`, a valid DNS-1123 label of at most 63 characters.
fn namespace_name(prefix: &str) -> String {
    let mut clean = String::new();
    for c in prefix.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            clean.push(c);
        } else if !clean.ends_with('-') {
            clean.push('-');
        }
    }
    clean.truncate(40);
    let clean = clean.trim_matches('-');
    let suffix = random_suffix(6);
    if clean.is_empty() {
        format!("t-{suffix}")
    } else {
        format!("t-{clean}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for prefix in ["", "gc", "My_Test::Case", "--x--", &"a".repeat(100)] {
            let name = namespace_name(prefix);
            assert!(name.len() <= 63, "{name}");
            assert!(name.starts_with("t-"), "{name}");
            assert!(!name.ends_with('-'), "{name}");
            assert!(!name.contains("--"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
        assert!(namespace_name("My_Test").starts_with("t-my-test-"));
    }
}
