//! A component run as the ServiceAccount the chart gives it, so a test proves its RBAC instead of
//! assuming it: the roles are the generated ones (`config/rbac/<component>.*.yaml`, rendered by
//! `cargo xtask gen` from the component's `src/rbac.rs`), with the namespaces a test uses, and
//! the component authenticates with a TokenRequest token of that account. A call the list
//! forgot is then refused by the real API server, and the test fails.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::plane::{kubeconfig_yaml, workspace_root};
use crate::{ControlPlane, TestkitError};

const MANAGER: &str = "warmcache-testkit";

/// Server-side applies an RBAC object (`Role`, `ClusterRole` or their bindings).
async fn apply_object(
    client: &Client,
    namespace: Option<&str>,
    kind: &str,
    name: &str,
    object: &serde_json::Value,
) -> Result<(), kube::Error> {
    let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
    let plural = format!("{}s", kind.to_ascii_lowercase());
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map(|_| ())
}

fn from_json<T: k8s_openapi::serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, TestkitError> {
    serde_json::from_value(value)
        .map_err(|e| TestkitError::InvalidArgument(format!("building an RBAC object: {e}")))
}

/// A component's ServiceAccount with its generated roles bound, and a kubeconfig that
/// authenticates as it.
#[derive(Debug)]
pub struct ComponentAccount {
    /// The account's namespace (the component's own namespace).
    pub namespace: String,
    /// The account's name, `warmcache-<component>`.
    pub name: String,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl ComponentAccount {
    /// Creates the account `warmcache-<component>` in `own_namespace`, applies the component's
    /// generated roles (the Role of its own namespace into `own_namespace`, the control-namespace
    /// Role into `control_namespace`, the ClusterRole as generated), binds them to the account
    /// and writes a kubeconfig with a one-hour token of it. `client` must be allowed to grant
    /// the roles (the plane's admin).
    pub async fn create(
        plane: &ControlPlane,
        client: &Client,
        component: &str,
        own_namespace: &str,
        control_namespace: &str,
    ) -> Result<ComponentAccount, TestkitError> {
        let name = format!("warmcache-{component}");
        let apply = PatchParams::apply(MANAGER).force();
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), own_namespace);
        let account = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        accounts
            .patch(&name, &apply, &Patch::Apply(&account))
            .await
            .map_err(|e| TestkitError::kube(format!("creating ServiceAccount {name}"), e))?;
        let subject = json!({"kind": "ServiceAccount", "name": name, "namespace": own_namespace});
        let dir = workspace_root().join("config/rbac");
        let mut found = false;
        for (suffix, namespace) in [
            ("role", Some(own_namespace)),
            ("control-role", Some(control_namespace)),
            ("clusterrole", None),
        ] {
            let path = dir.join(format!("{component}.{suffix}.yaml"));
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(TestkitError::io(format!("reading {}", path.display()), e)),
            };
            found = true;
            let manifest = |message: String| TestkitError::Manifest {
                path: path.clone(),
                message,
            };
            let mut role: serde_json::Value =
                serde_saphyr::from_str(&text).map_err(|e| manifest(e.to_string()))?;
            let role_name = role["metadata"]["name"]
                .as_str()
                .ok_or_else(|| manifest("no metadata.name".to_owned()))?
                .to_owned();
            let (kind, binding_kind) = match namespace {
                Some(namespace) => {
                    role["metadata"]["namespace"] = json!(namespace);
                    ("Role", "RoleBinding")
                }
                None => ("ClusterRole", "ClusterRoleBinding"),
            };
            apply_object(client, namespace, kind, &role_name, &role)
                .await
                .map_err(|e| TestkitError::kube(format!("applying {}", path.display()), e))?;
            // One binding per account: tests in one process use several namespaces.
            let binding_name = format!("{role_name}-{own_namespace}");
            let mut binding = json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": binding_kind,
                "metadata": {"name": binding_name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role_name},
                "subjects": [subject],
            });
            if let Some(namespace) = namespace {
                binding["metadata"]["namespace"] = json!(namespace);
            }
            apply_object(client, namespace, binding_kind, &binding_name, &binding)
                .await
                .map_err(|e| TestkitError::kube(format!("binding {kind} {role_name}"), e))?;
        }
        if !found {
            return Err(TestkitError::InvalidArgument(format!(
                "no generated roles for component {component:?} in {}",
                dir.display()
            )));
        }
        let request: TokenRequest = from_json(json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        }))?;
        let token = accounts
            .create_token_request(&name, &PostParams::default(), &request)
            .await
            .map_err(|e| TestkitError::kube(format!("requesting a token of {name}"), e))?
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| TestkitError::Unavailable(format!("no token issued for {name}")))?;
        let dir = tempfile::tempdir()
            .map_err(|e| TestkitError::io("creating the account's directory", e))?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(plane.server_url(), plane.ca_pem(), &token),
        )
        .map_err(|e| TestkitError::io(format!("writing {}", kubeconfig.display()), e))?;
        Ok(ComponentAccount {
            namespace: own_namespace.to_owned(),
            name,
            kubeconfig,
            _dir: dir,
        })
    }

    /// A kubeconfig authenticating as the account.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client authenticating as the account.
    pub async fn client(&self) -> Result<Client, TestkitError> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Client::try_from(config).map_err(|e| TestkitError::kube("building the account's client", e))
    }
}
