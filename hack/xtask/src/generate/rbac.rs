//! The `rbac` artifact: each component's ClusterRole and Roles, rendered from the permission
//! list kept next to its code (`cmd/<component>/src/rbac.rs`, checked by
//! `warmcache_kube::rbac::check`), so the chart grants exactly the calls the code makes.
//!
//! One file per role, `<component>.<clusterrole|role|control-role>.yaml`: the Roles name the
//! default namespaces (`warmcache-system` for the component's own, `nvca-modelcache-init` for
//! the control namespace); the chart's templates set the installed ones and add the
//! ServiceAccounts and bindings. Each file starts with the permissions and why each is needed.

use anyhow::{Context, Result};
use serde::Serialize;
use warmcache_api_modelcache::DEFAULT_CONTROL_NAMESPACE;
use warmcache_kube::rbac::{self, Permission, Scope};

use super::{GeneratedFile, header};

/// What the roles are generated from, as named in their header and in `--check` hints.
pub const SOURCE: &str = "the permission lists of the cmd/ crates (src/rbac.rs)";

/// The namespace the roles of a component's own namespace name before the chart sets it.
pub const DEFAULT_OWN_NAMESPACE: &str = "warmcache-system";

/// Every component with API calls, and its list.
pub fn components() -> Vec<(&'static str, Vec<Permission>)> {
    vec![
        (
            warmcache_binding_controller::rbac::COMPONENT,
            warmcache_binding_controller::rbac::permissions(),
        ),
        (
            warmcache_kvcache_operator::webhook::COMPONENT,
            warmcache_kvcache_operator::rbac::permissions(),
        ),
        (
            warmcache_model_volume_controller::rbac::COMPONENT,
            warmcache_model_volume_controller::rbac::permissions(),
        ),
        (
            warmcache_reaper::rbac::COMPONENT,
            warmcache_reaper::rbac::permissions(),
        ),
        (
            warmcache_uninstall_hook::rbac::COMPONENT,
            warmcache_uninstall_hook::rbac::permissions(),
        ),
        (
            warmcache_webhook::serve::COMPONENT,
            warmcache_webhook::rbac::permissions(),
        ),
    ]
}

fn render<T: Serialize>(
    component: &str,
    scope: Scope,
    permissions: &[Permission],
    object: &T,
) -> Result<GeneratedFile> {
    let name = format!("{component}.{}.yaml", scope.file_suffix());
    let body = serde_saphyr::to_string(object).with_context(|| format!("serializing {name}"))?;
    let mut why = String::new();
    for p in permissions.iter().filter(|p| p.scope == scope) {
        let resource = if p.group.is_empty() {
            p.resource.to_owned()
        } else {
            format!("{}.{}", p.resource, p.group)
        };
        let names = if p.names.is_empty() {
            String::new()
        } else {
            format!(" [{}]", p.names.join(", "))
        };
        why.push_str(&format!(
            "# {resource}{names} {}: {}\n",
            p.verbs.join(","),
            p.why
        ));
    }
    Ok(GeneratedFile {
        name,
        content: format!("{}{why}{body}", header(SOURCE)),
    })
}

/// A component's roles as generated (the default namespaces).
pub fn generated_roles(component: &str, permissions: &[Permission]) -> Result<rbac::Roles> {
    rbac::roles(
        component,
        permissions,
        DEFAULT_OWN_NAMESPACE,
        DEFAULT_CONTROL_NAMESPACE,
    )
    .with_context(|| format!("the permissions of {component}"))
}

/// The artifact's source-of-truth function.
pub fn render_all() -> Result<Vec<GeneratedFile>> {
    let mut files = Vec::new();
    for (component, permissions) in components() {
        let permissions = permissions.as_slice();
        let roles = generated_roles(component, permissions)?;
        if let Some(role) = &roles.cluster {
            files.push(render(component, Scope::Cluster, permissions, role)?);
        }
        if let Some(role) = &roles.own_namespace {
            files.push(render(component, Scope::OwnNamespace, permissions, role)?);
        }
        if let Some(role) = &roles.control_namespace {
            files.push(render(
                component,
                Scope::ControlNamespace,
                permissions,
                role,
            )?);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_is_rendered_with_its_reasons_and_no_wildcard() {
        let files = render_all().unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        for expected in [
            "webhook.clusterrole.yaml",
            "webhook.role.yaml",
            "webhook.control-role.yaml",
            "kvcache-operator.clusterrole.yaml",
            "kvcache-operator.role.yaml",
        ] {
            assert!(names.contains(&expected), "{names:?}");
        }
        for file in &files {
            assert!(super::super::is_generated(file.content.as_bytes()));
            assert!(!file.content.contains("'*'"), "{}", file.content);
            assert!(!file.content.contains("\"*\""), "{}", file.content);
        }
        let webhook = &files
            .iter()
            .find(|f| f.name == "webhook.role.yaml")
            .unwrap()
            .content;
        assert!(webhook.contains("namespace: warmcache-system"), "{webhook}");
        assert!(webhook.contains("nvcf-storage-capabilities"), "{webhook}");
        assert!(
            webhook.contains("# configmaps [nvcf-storage-capabilities] list,watch: "),
            "{webhook}"
        );
    }
}
