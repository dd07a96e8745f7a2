//! Server-side apply, create-or-get and opt-in pruning against the real API server.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta};
use kube::{Resource, ResourceExt};
use warmcache_kube::apply::prune::prune_unlisted;
use warmcache_kube::{
    Applier, COMPONENT_LABEL, Created, Error, ErrorCategory, create_or_get, set_managed_labels,
};
use warmcache_testkit::TestNamespace;

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

fn managers(obj: &ConfigMap) -> Vec<(String, String)> {
    obj.meta()
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn server_side_apply_is_idempotent_and_conflicts_without_force() {
    let ns = TestNamespace::new("kube-ssa").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let mine = Applier::new("warmcache-test-a");
    let theirs = Applier::new("warmcache-test-b");
    assert_eq!(mine.field_manager(), "warmcache-test-a");

    let desired = cm("ssa", &[("k", "mine")]);
    let first = mine.apply(&api, &desired).await.unwrap();
    assert_eq!(first.data.as_ref().unwrap()["k"], "mine");
    assert!(
        managers(&first).contains(&("warmcache-test-a".into(), "Apply".into())),
        "{:?}",
        managers(&first)
    );
    let again = mine.apply(&api, &desired).await.unwrap();
    assert_eq!(
        again.resource_version(),
        first.resource_version(),
        "re-applying the same intent must not write"
    );

    // Another manager wanting another value for the same field: 409 Conflict without force.
    let err = theirs
        .apply(&api, &cm("ssa", &[("k", "theirs")]))
        .await
        .unwrap_err();
    assert_eq!(err.category(), ErrorCategory::Conflict, "{err:?}");
    assert!(err.is_conflict());
    assert!(matches!(err, Error::Api { verb: "apply", .. }), "{err:?}");
    assert_eq!(api.get("ssa").await.unwrap().data.unwrap()["k"], "mine");

    // A field nobody else owns applies fine next to ours; force takes the contested one.
    let shared = theirs
        .apply(&api, &cm("ssa", &[("other", "x")]))
        .await
        .unwrap();
    assert_eq!(shared.data.as_ref().unwrap()["k"], "mine");
    assert_eq!(shared.data.as_ref().unwrap()["other"], "x");
    let forced = theirs
        .force_apply(&api, &cm("ssa", &[("k", "theirs")]))
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["k"], "theirs");

    // No name: refused before any request.
    let err = mine.apply(&api, &ConfigMap::default()).await.unwrap_err();
    assert!(matches!(err, Error::MissingName { .. }), "{err:?}");
    ns.cleanup().await;
}

#[tokio::test]
async fn create_or_get_returns_the_stored_object_and_never_overwrites() {
    let ns = TestNamespace::new("kube-cog").await.unwrap();
    let api: Api<ConfigMap> = ns.api();

    let first = create_or_get(&api, &cm("cog", &[("v", "first")]))
        .await
        .unwrap();
    assert!(first.was_created());
    let stored_uid = first.object().uid();

    let second = create_or_get(&api, &cm("cog", &[("v", "second")]))
        .await
        .unwrap();
    let Created::Existing(existing) = second else {
        panic!("expected Existing, got {second:?}");
    };
    assert_eq!(existing.uid(), stored_uid);
    assert_eq!(
        existing.data.as_ref().unwrap()["v"],
        "first",
        "the stored object, not the caller's"
    );
    assert_eq!(api.get("cog").await.unwrap().data.unwrap()["v"], "first");
    ns.cleanup().await;
}

#[tokio::test]
async fn prune_deletes_only_labelled_unlisted_objects() {
    let ns = TestNamespace::new("kube-prune").await.unwrap();
    let api: Api<ConfigMap> = ns.api();
    let applier = Applier::new("warmcache-test-prune");
    let labelled = |name: &str, component: &str, instance: &str| {
        let mut obj = cm(name, &[]);
        set_managed_labels(&mut obj.metadata, component).unwrap();
        obj.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert("app.kubernetes.io/instance".into(), instance.into());
        obj
    };
    for obj in [
        labelled("keep-me", "test-prune", "one"),
        labelled("orphan-a", "test-prune", "one"),
        labelled("orphan-b", "test-prune", "one"),
        labelled("other-component", "someone-else", "one"),
        labelled("other-instance", "test-prune", "two"),
        cm("unlabelled", &[]),
    ] {
        applier.apply(&api, &obj).await.unwrap();
    }
    // Same instance label but missing the component label: not ours.
    let mut half = labelled("half-labelled", "test-prune", "one");
    half.metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(COMPONENT_LABEL);
    applier.apply(&api, &half).await.unwrap();

    let keep = BTreeSet::from(["keep-me".to_owned()]);
    let pruned = prune_unlisted(&api, "test-prune", "app.kubernetes.io/instance=one", &keep)
        .await
        .unwrap();
    let mut deleted = pruned.deleted.clone();
    deleted.sort();
    assert_eq!(deleted, ["orphan-a", "orphan-b"]);
    assert_eq!(pruned.kept, 1);
    assert!(pruned.replaced.is_empty());

    let mut left: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .filter(|n| n != "kube-root-ca.crt")
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "half-labelled",
            "keep-me",
            "other-component",
            "other-instance",
            "unlabelled"
        ]
    );

    // Without the instance term every unlisted object of the component goes, still not the
    // half-labelled, foreign or unlabelled ones.
    let again = prune_unlisted(&api, "test-prune", "", &keep).await.unwrap();
    assert_eq!(again.deleted, ["other-instance"]);
    ns.cleanup().await;
}
