//! Names, scope, subresources and printer columns of the generated CRD.

// Test helpers outside #[test] functions may fail loudly too (clippy.toml allows it only inside).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use kube::CustomResourceExt;
use warmcache_api_kvcache::v1alpha1::{self, KVCacheBackend};

#[test]
fn identity() {
    let crd = KVCacheBackend::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("kvcachebackends.worker.gpustack.ai")
    );
    assert_eq!(crd.spec.group, v1alpha1::GROUP);
    assert_eq!(crd.spec.scope, "Cluster");
    let names = &crd.spec.names;
    assert_eq!(names.kind, v1alpha1::KIND);
    assert_eq!(names.plural, "kvcachebackends");
    assert_eq!(names.short_names.as_deref(), Some(&["kvcb".to_owned()][..]));
    assert_eq!(
        names.categories.as_deref(),
        Some(&["gpustack".to_owned()][..])
    );
    assert_eq!(
        KVCacheBackend::api_resource().api_version,
        v1alpha1::API_VERSION
    );

    let [version] = crd.spec.versions.as_slice() else {
        panic!("one version")
    };
    assert_eq!(version.name, v1alpha1::VERSION);
    assert!(version.served && version.storage);
    let subresources = version.subresources.as_ref().expect("subresources");
    assert!(subresources.status.is_some());
    assert!(subresources.scale.is_none());
}

#[test]
fn printer_columns() {
    let crd = KVCacheBackend::crd();
    let columns: Vec<(&str, &str, &str)> = crd.spec.versions[0]
        .additional_printer_columns
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Type", "string", ".spec.type"),
            ("Phase", "string", ".status.phase"),
            (
                "Endpoint",
                "string",
                ".status.endpoints[?(@.name=='Client')].address"
            ),
            ("Capacity", "string", ".status.capacity.total"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn every_field_is_documented() {
    // Field descriptions are what `kubectl explain` prints.
    fn walk(at: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
        let Some(props) = at.get("properties").and_then(|p| p.as_object()) else {
            if let Some(items) = at.get("items") {
                walk(items, &format!("{path}[]"), missing);
            }
            return;
        };
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            // apiVersion/kind/metadata are described by Kubernetes itself; securityContext is
            // the core type's schema.
            let foreign = path.is_empty()
                && ["apiVersion", "kind", "metadata"].contains(&name.as_str())
                || here.contains(".securityContext")
                || here.contains(".conditions[]")
                || here.contains(".imagePullSecrets[]");
            if !foreign && !prop.get("description").is_some_and(|d| d.is_string()) {
                missing.push(here.clone());
            }
            if !foreign {
                walk(prop, &here, missing);
            }
        }
    }
    let crd = KVCacheBackend::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema");
    let schema = serde_json::to_value(schema).expect("serializes");
    let mut missing = Vec::new();
    walk(&schema, "", &mut missing);
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:#?}"
    );
}

#[test]
fn optional_enum_fields_keep_their_docs() {
    let crd = KVCacheBackend::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema");
    let schema = serde_json::to_value(schema).expect("serializes");
    let spec = &schema["properties"]["spec"]["properties"];
    let member = &spec["connection"]["properties"]["managed"]["properties"]["members"]["items"]["properties"];
    let tier = &member["localDisks"]["items"]["properties"];
    for (field, words) in [
        (&spec["imagePullPolicy"], "follows the tag"),
        (&tier["eviction"]["properties"]["policy"], "Unset keeps"),
        (
            &member["hostPaths"]["items"]["properties"]["type"],
            "kubelet makes",
        ),
        (&member["medium"], "Immutable"),
    ] {
        let description = field["description"].as_str().unwrap_or_default();
        assert!(
            description.contains(words),
            "{description:?} lacks {words:?}"
        );
    }
}
