//! Installing CustomResourceDefinitions and waiting until the API server serves them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client};

use crate::{TestkitError, eventually};

/// Field manager used for everything the kit applies.
pub const FIELD_MANAGER: &str = "warmcache-testkit";

/// Creates or updates `crd` (server-side apply, forced, field manager `warmcache-testkit`).
pub async fn apply_crd(
    client: &Client,
    crd: &CustomResourceDefinition,
) -> Result<(), TestkitError> {
    let name = crd
        .metadata
        .name
        .as_deref()
        .ok_or_else(|| TestkitError::InvalidArgument("CRD without metadata.name".into()))?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut body = crd.clone();
    body.metadata.managed_fields = None;
    body.metadata.resource_version = None;
    body.status = None;
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| TestkitError::kube(format!("applying CRD {name}"), e))?;
    Ok(())
}

/// Waits until the CRD `name` has the condition `Established=True` and every version it
/// serves answers a list. `Established` alone is not enough: the API server sets it before its
/// handler for the resource serves, and a request in between gets `404 page not found` (seen
/// creating the first custom resource right after the wait on a loaded machine).
pub async fn wait_crd_established(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<(), TestkitError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(
        &format!("CRD {name} to be Established and served"),
        timeout,
        || {
            let api = api.clone();
            let client = client.clone();
            async move {
                let crd = api.get_opt(name).await.ok().flatten()?;
                let established = crd
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if !established {
                    return None;
                }
                let spec = &crd.spec;
                for version in spec.versions.iter().filter(|v| v.served) {
                    let resource = ApiResource::from_gvk_with_plural(
                        &GroupVersionKind::gvk(&spec.group, &version.name, &spec.names.kind),
                        &spec.names.plural,
                    );
                    let served: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                    served.list(&ListParams::default().limit(1)).await.ok()?;
                }
                Some(())
            }
        },
    )
    .await
}

/// Applies every CRD found in `*.yaml` / `*.yml` files under `dir` (recursively, in path order;
/// multi-document files allowed, other kinds ignored) and waits until each is Established.
/// A missing directory installs nothing. Returns the CRD names.
pub async fn install_crds_from_dir(
    client: &Client,
    dir: &Path,
    timeout: Duration,
) -> Result<Vec<String>, TestkitError> {
    let mut files = Vec::new();
    collect_yaml(dir, &mut files)?;
    files.sort();
    let mut crds = Vec::new();
    for file in &files {
        crds.extend(parse_crds(file)?);
    }
    for crd in &crds {
        apply_crd(client, crd).await?;
    }
    let mut names = Vec::with_capacity(crds.len());
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        wait_crd_established(client, &name, timeout).await?;
        names.push(name);
    }
    Ok(names)
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), TestkitError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(TestkitError::io(format!("listing {}", dir.display()), e)),
    };
    for entry in entries {
        let path = entry
            .map_err(|e| TestkitError::io(format!("listing {}", dir.display()), e))?
            .path();
        if path.is_dir() {
            collect_yaml(&path, out)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
    Ok(())
}

/// Parses the CRDs in one manifest file (other kinds and empty documents are skipped).
pub fn parse_crds(path: &Path) -> Result<Vec<CustomResourceDefinition>, TestkitError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TestkitError::io(format!("reading {}", path.display()), e))?;
    parse_crds_str(&text).map_err(|message| TestkitError::Manifest {
        path: path.to_path_buf(),
        message,
    })
}

fn parse_crds_str(text: &str) -> Result<Vec<CustomResourceDefinition>, String> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    let mut crds = Vec::new();
    for doc in docs {
        if doc.get("kind").and_then(|k| k.as_str()) != Some("CustomResourceDefinition") {
            continue;
        }
        crds.push(serde_json::from_value(doc).map_err(|e| e.to_string())?);
    }
    Ok(crds)
}

/// Name of the LeaderWorkerSet CRD [`install_leaderworkerset_crd`] installs.
pub const LEADERWORKERSET_CRD: &str = "leaderworkersets.leaderworkerset.x-k8s.io";

/// Installs the LeaderWorkerSet API (`leaderworkerset.x-k8s.io/v1`, namespaced) with an open
/// schema and waits until it is served: as much of it as an owner lookup or a worker pod's
/// admission reads. No LeaderWorkerSet controller runs: a test makes the leader's StatefulSet
/// and pods itself. Idempotent, so tests sharing a control plane may each call it.
pub async fn install_leaderworkerset_crd(client: &Client) -> Result<(), TestkitError> {
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": LEADERWORKERSET_CRD },
        "spec": {
            "group": "leaderworkerset.x-k8s.io",
            "scope": "Namespaced",
            "names": {
                "plural": "leaderworkersets", "singular": "leaderworkerset",
                "kind": "LeaderWorkerSet", "shortNames": ["lws"],
            },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                } },
            }],
        },
    }))
    .map_err(|e| TestkitError::InvalidArgument(format!("the LeaderWorkerSet CRD: {e}")))?;
    apply_crd(client, &crd).await?;
    wait_crd_established(client, LEADERWORKERSET_CRD, Duration::from_secs(60)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multi_document_manifests() {
        let text = r#"# generated
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
"#;
        let crds = parse_crds_str(text).unwrap();
        assert_eq!(crds.len(), 1);
        assert_eq!(
            crds[0].metadata.name.as_deref(),
            Some("widgets.example.com")
        );
        assert_eq!(crds[0].spec.versions[0].name, "v1");
    }
}
