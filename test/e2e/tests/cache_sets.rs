//! Compile-cache sets, end to end, black box: the chart installed with the real Helm CLI on the
//! real test node with `webhook.compileCacheSets=true` and the node agent, and the example
//! workload whose engine "compiles" at start the way torch.compile fills its Inductor cache:
//! a startup plan written under `TORCHINDUCTOR_CACHE_DIR` unless one is there already. The
//! first pod compiles (admitted as a capture source of its set); once it is Ready, the node
//! agent collects its compile caches into the set and the binding controller completes it; the
//! next pod of the same configuration starts from the set (an init container seeds its local
//! cache directory) and finds the first pod's plan, while the credentials the first engine left
//! in its cache directory never travel.
//!
//! The engine is a stand-in (no GPU here): it verifies the model, then reads or writes its plan.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, LogParams, Patch, PatchParams};
use serde_json::json;
use warmcache_e2e::{
    READY_TIMEOUT, Scenario, app_pods, bindings_api, is_ready, model, webhook_serving,
};
use warmcache_testkit::eventually;

const CACHE_KEY_LABEL: &str = "nvsnap.io/cache-key";
const CACHE_CAPTURE_LABEL: &str = "warmcache.nvidia.io/cache-capture";
const CACHE_BINDING_ANNOTATION: &str = "warmcache.nvidia.io/cache-set-binding";
const SEED_CONTAINER: &str = "nvsnap-cache-seed";

/// The example workload with an engine that compiles at start: it writes its startup plan (its
/// pod name) under `TORCHINDUCTOR_CACHE_DIR` and leaves credentials beside it, unless a plan is
/// there already, which it reports; then it is Ready.
fn compiling(mut workload: Deployment) -> Deployment {
    let spec = workload.spec.template.spec.as_mut().unwrap();
    let engine = spec
        .containers
        .iter_mut()
        .find(|c| c.name == "engine")
        .unwrap();
    engine.command = Some(vec![
        "sh".to_owned(),
        "-c".to_owned(),
        r#"set -e
cd /models/llm && sha256sum -c SHA256SUMS >/dev/null
plan="$TORCHINDUCTOR_CACHE_DIR/plan/startup-plan"
if [ -f "$plan" ]; then
  echo "compile cache: seeded from $(cat "$plan")"
  if [ -e "$VLLM_CACHE_ROOT/.ngc/config" ] || [ -e "$TORCHINDUCTOR_CACHE_DIR/plan/token" ]; then
    echo "compile cache: a credential travelled"
  fi
else
  echo "compile cache: compiling"
  mkdir -p "$(dirname "$plan")" "$VLLM_CACHE_ROOT/.ngc"
  echo "$HOSTNAME" > "$plan"
  echo secret > "$VLLM_CACHE_ROOT/.ngc/config"
  echo secret > "$TORCHINDUCTOR_CACHE_DIR/plan/token"
fi
touch /tmp/ready && exec sleep 2147483647"#
            .to_owned(),
    ]);
    workload
}

async fn engine_log(pods: &Api<Pod>, name: &str) -> String {
    let params = LogParams {
        container: Some("engine".to_owned()),
        ..LogParams::default()
    };
    pods.logs(name, &params).await.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_pods_compile_caches_seed_the_next_pod_of_its_configuration() {
    let started = Instant::now();
    let run = Scenario::new("cache-sets")
        .model(model(4 << 20))
        .gpus(2)
        .node_agent()
        .extra_sets(&["webhook.compileCacheSets=true"])
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let workload = compiling(run.workload().unwrap());
    let ns = run.namespace("e2e-cache-sets", &[]).await.unwrap();
    if let Err(e) = webhook_serving(&client, &ns.name, &workload).await {
        panic!("{e}\n{}", run.report(&[]).await);
    }

    // One replica: it compiles, and is admitted as the capture source of its set.
    let source = run
        .one_ready_replica(&ns, &workload)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pods = ns.api::<Pod>();
    let source_name = source.name_any();
    assert_eq!(
        source.labels().get(CACHE_CAPTURE_LABEL).map(String::as_str),
        Some("true"),
        "a capture source of its set: {:?}",
        source.labels()
    );
    assert!(source.labels().contains_key(CACHE_KEY_LABEL));
    assert!(
        engine_log(&pods, &source_name)
            .await
            .contains("compile cache: compiling")
    );
    let set = source.annotations()[CACHE_BINDING_ANNOTATION].clone();
    eprintln!(
        "first pod {source_name} Ready after {:.1?}",
        started.elapsed()
    );

    // The node agent collects its compile caches; the set completes, with a view here.
    let bindings = bindings_api(&client);
    let complete = eventually("the set Ready with a view here", READY_TIMEOUT, || {
        let (bindings, set, ns) = (bindings.clone(), set.clone(), ns.name.clone());
        async move {
            let b = bindings.get(&set).await.ok()?;
            let status = &b.data["status"];
            let viewed = status["realized"]["views"]
                .as_array()?
                .iter()
                .any(|v| v["namespace"] == ns.as_str());
            (status["realized"]["populationState"] == "Ready" && viewed).then(|| status.clone())
        }
    })
    .await;
    let status = match complete {
        Ok(s) => s,
        Err(e) => panic!("{e}\n{}", run.report(&[ns.name.as_str()]).await),
    };
    assert!(
        status["modelUri"]
            .as_str()
            .is_some_and(|u| u.starts_with("cache://")),
        "the set shows its handle: {status}"
    );
    eprintln!(
        "the set is complete ({} bytes) after {:.1?}",
        status["realized"]["bytes"],
        started.elapsed()
    );

    // A second replica: seeded from the set, it starts with the first pod's plan and without
    // its credentials.
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let seeded = eventually("the second pod Ready", READY_TIMEOUT, || {
        let pods = pods.clone();
        let source_name = source_name.clone();
        async move {
            app_pods(&pods)
                .await?
                .into_iter()
                .find(|p| p.name_any() != source_name && is_ready(p))
        }
    })
    .await;
    let Ok(seeded) = seeded else {
        panic!(
            "the second pod never became Ready\n{}",
            run.report(&[ns.name.as_str()]).await
        );
    };
    let name = seeded.name_any();
    assert!(
        !seeded.labels().contains_key(CACHE_CAPTURE_LABEL),
        "{name}: seeded, not a capture source"
    );
    assert_eq!(
        seeded.annotations().get(CACHE_BINDING_ANNOTATION),
        Some(&set),
        "{name}: the same set"
    );
    let spec = seeded.spec.as_ref().unwrap();
    assert!(
        spec.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == SEED_CONTAINER),
        "{name}: the seed container"
    );
    let log = engine_log(&pods, &name).await;
    assert!(
        log.contains(&format!("compile cache: seeded from {source_name}")),
        "{name} starts from {source_name}'s plan: {log}"
    );
    assert!(
        !log.contains("a credential travelled"),
        "{name}: credentials never travel: {log}"
    );
    eprintln!(
        "cache sets: {name} started from {source_name}'s compile caches {:.1?} after the test began",
        started.elapsed()
    );
    run.finish().await;
}
