//! What the shared helpers do for a component, that component's generated roles allow: each
//! component runs as the ServiceAccount of the chart (`warmcache_testkit::ComponentAccount`).
//!
//! The component tests exercise the helpers' common paths; these cover the paths a component
//! takes only now and then, which a missing grant would break in production alone:
//!
//! - an Event repeated (kube's recorder folds it into a series: `create`, then `patch`); a
//!   refused Event is only logged, so each test reads the stored series back;
//! - a finalizer patch whose guard fails because the object changed since it was read (the
//!   helper re-reads it: `get`).

use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_api_modelcache::v2beta1::{BindingIdentity, ModelCacheBinding, Workflow};
use warmcache_testkit::ComponentAccount;

use super::*;

/// A namespace for a component's own objects, one for its control-namespace Role, and its
/// account with the generated roles bound.
struct Component {
    own: TestNamespace,
    control: String,
    account: ComponentAccount,
}

impl Component {
    async fn new(component: &str, prefix: &str) -> Component {
        let plane = ControlPlane::shared().await.unwrap();
        let own = TestNamespace::new(prefix).await.unwrap();
        let control = format!("{}-ctl", own.name);
        let namespaces: Api<Namespace> = Api::all(own.client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(control.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let account = ComponentAccount::create(plane, &own.client, component, &own.name, &control)
            .await
            .unwrap();
        Component {
            own,
            control,
            account,
        }
    }

    async fn cleanup(self) {
        let namespaces: Api<Namespace> = Api::all(self.own.client.clone());
        let _ = namespaces
            .delete(&self.control, &DeleteParams::default())
            .await;
        self.own.cleanup().await;
    }
}

/// Records the same Warning twice as `component` about `regarding` and waits for the stored
/// Event to count both.
async fn repeated_event_is_one_series(
    component: &Component,
    name: &str,
    regarding: ObjectReference,
) {
    let client = component.account.client().await.unwrap();
    let recorder = EventRecorder::new(client, name, None);
    let reason = "RoleCheck";
    for _ in 0..2 {
        recorder
            .publish(
                &regarding,
                EventType::Warning,
                reason,
                "Reconcile",
                Some("the same failure, again"),
            )
            .await;
    }
    let namespace = regarding
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let events: Api<K8sEvent> = Api::namespaced(component.own.client.clone(), &namespace);
    let regarded = regarding.name.clone().unwrap();
    eventually(&format!("{name}: one Event counting both"), WAIT, || {
        let (events, regarded) = (events.clone(), regarded.clone());
        async move {
            let list = events.list(&Default::default()).await.ok()?.items;
            list.iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.reporting_controller.as_deref() == Some(name)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(regarded.as_str())
                })
                .and_then(|e| e.series.as_ref())
                .filter(|series| series.count >= 2)
                .map(|_| ())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{name}: {e}"));
}

fn pod_reference(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        ..ObjectReference::default()
    }
}

#[tokio::test]
async fn each_component_folds_a_repeated_event_into_a_series_under_its_own_roles() {
    // Components that report on objects anywhere (pods of every namespace, cluster-scoped
    // backends and nodes in `default`) hold Events cluster-wide; the reaper and the binding
    // controller report on the bindings of the control namespace only.
    for (component, prefix) in [
        ("webhook", "roles-wh"),
        ("model-volume-controller", "roles-mvc"),
    ] {
        let c = Component::new(component, prefix).await;
        let pod = pod_reference(&c.own.name, "reader-0");
        repeated_event_is_one_series(&c, &format!("warmcache-{component}"), pod).await;
        c.cleanup().await;
    }

    let c = Component::new("kvcache-operator", "roles-kvc").await;
    let backend = ObjectReference {
        api_version: Some("worker.gpustack.ai/v1alpha1".to_owned()),
        kind: Some("KVCacheBackend".to_owned()),
        name: Some(format!("{}-kvc", c.own.name)),
        ..ObjectReference::default()
    };
    repeated_event_is_one_series(&c, "warmcache-kvcache-operator", backend).await;
    c.cleanup().await;

    for (component, prefix) in [("reaper", "roles-reap"), ("binding-controller", "roles-bc")] {
        let c = Component::new(component, prefix).await;
        let binding = ObjectReference {
            api_version: Some("nvca.nvcf.nvidia.io/v2beta1".to_owned()),
            kind: Some("ModelCacheBinding".to_owned()),
            namespace: Some(c.control.clone()),
            name: Some("model-cache-retired".to_owned()),
            ..ObjectReference::default()
        };
        repeated_event_is_one_series(&c, &format!("warmcache-{component}"), binding).await;
        c.cleanup().await;
    }
}

const OTHER_FINALIZER: &str = "example.com/keep";

fn backend(name: &str) -> KVCacheBackend {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "KVCacheBackend",
        "metadata": {"name": name},
        "spec": {"connection": {"external": {"endpoints": [
            {"name": "Client", "address": "store.example.internal:50051"},
        ]}}},
    }))
    .unwrap()
}

/// Adds `OTHER_FINALIZER` behind the back of `stale` (read before), so a guarded patch through
/// `stale` fails on the server and the helper must re-read the object.
async fn change_behind<K>(api: &Api<K>, stale: &K)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    add_finalizer(api, stale, OTHER_FINALIZER).await.unwrap();
}

#[tokio::test]
async fn finalizer_patches_through_a_stale_copy_re_read_under_each_components_roles() {
    // The operator adds its teardown finalizer to a backend someone changed since it was read.
    let c = Component::new("kvcache-operator", "roles-fin-kvc").await;
    let admin: Api<KVCacheBackend> = Api::all(c.own.client.clone());
    let name = format!("{}-kvc", c.own.name);
    let stale = admin
        .create(&PostParams::default(), &backend(&name))
        .await
        .unwrap();
    change_behind(&admin, &stale).await;
    let operator: Api<KVCacheBackend> = Api::all(c.account.client().await.unwrap());
    let updated = add_finalizer(&operator, &stale, warmcache_api_kvcache::FINALIZER)
        .await
        .unwrap();
    assert_eq!(
        updated.finalizers(),
        [OTHER_FINALIZER, warmcache_api_kvcache::FINALIZER]
    );
    for finalizer in [OTHER_FINALIZER, warmcache_api_kvcache::FINALIZER] {
        let current = admin.get(&name).await.unwrap();
        remove_finalizer(&admin, &current, finalizer).await.unwrap();
    }
    admin.delete(&name, &DeleteParams::default()).await.unwrap();
    c.cleanup().await;

    // The uninstall hook strips the finalizers of a backend (`--force`) and of a binding, both
    // changed since it listed them.
    let c = Component::new("uninstall-hook", "roles-fin-uh").await;
    let hook = c.account.client().await.unwrap();
    let admin: Api<KVCacheBackend> = Api::all(c.own.client.clone());
    let name = format!("{}-kvc", c.own.name);
    let mut with_ours = backend(&name);
    with_ours.metadata.finalizers = Some(vec![warmcache_api_kvcache::FINALIZER.to_owned()]);
    let stale = admin
        .create(&PostParams::default(), &with_ours)
        .await
        .unwrap();
    change_behind(&admin, &stale).await;
    let as_hook: Api<KVCacheBackend> = Api::all(hook.clone());
    let updated = remove_finalizer(&as_hook, &stale, warmcache_api_kvcache::FINALIZER)
        .await
        .unwrap();
    assert_eq!(updated.finalizers(), [OTHER_FINALIZER]);
    remove_finalizer(&admin, &updated, OTHER_FINALIZER)
        .await
        .unwrap();
    admin.delete(&name, &DeleteParams::default()).await.unwrap();

    let bindings: Api<ModelCacheBinding> = Api::namespaced(c.own.client.clone(), &c.control);
    let identity = BindingIdentity::new(Workflow::HelmModelCache, "nca-123", "hf://org/roles@v1");
    let fixture = warmcache_api_modelcache::fixtures::binding(&c.control, "team-a", identity);
    let stale = bindings
        .create(&PostParams::default(), &fixture)
        .await
        .unwrap();
    assert!(
        !stale.finalizers().is_empty(),
        "the fixture carries our finalizer"
    );
    let ours = stale.finalizers()[0].clone();
    change_behind(&bindings, &stale).await;
    let as_hook: Api<ModelCacheBinding> = Api::namespaced(hook, &c.control);
    let updated = remove_finalizer(&as_hook, &stale, &ours).await.unwrap();
    assert_eq!(updated.finalizers(), [OTHER_FINALIZER]);
    remove_finalizer(&bindings, &updated, OTHER_FINALIZER)
        .await
        .unwrap();
    c.cleanup().await;
}
