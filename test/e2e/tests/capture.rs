//! Capture after Ready, end to end, black box: the chart installed with the real Helm CLI on
//! the real test node, and a workload whose engine downloads the model **by its own start
//! script**, the way an NGC engine pulls its model version (`NGC_MODEL_NAME` in the main
//! container): nothing a writer Job can reproduce. The first pod keeps its own download
//! (admitted as a capture source, its spec untouched); once it is Ready, the node agent copies
//! its landing into the cache and the binding controller completes it; the next pods read that
//! copy read-only and download nothing: the Hub serves the model once for three pods.
//!
//! The engine is a stand-in: NGC cannot be reached here, so its script fetches the same bytes
//! from the simulated Hub with the real `hf` client into the directory `NGC_MODEL_MOUNT` names,
//! only when they are not there yet (as engine scripts do), verifies every file's SHA-256 and is
//! Ready only then.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use warmcache_e2e::{
    BINDING_ANNOTATION, READY_TIMEOUT, Scenario, app_pods, bindings_api, is_ready, model,
    webhook_serving,
};
use warmcache_testkit::eventually;

const CAPTURE_LABEL: &str = "nvsnap.io/model-capture";
const ROLE_LABEL: &str = "nvsnap.io/model-role";
const LANDING: &str = "/models/ngc";

/// The example workload turned into an engine that downloads by itself: no init container; the
/// engine names its NGC model version and mount, and its script downloads into it when the
/// files are missing.
fn self_downloading(mut workload: Deployment) -> Deployment {
    let spec = workload.spec.template.spec.as_mut().unwrap();
    let init = spec.init_containers.take().unwrap().remove(0);
    let download = init.command.as_ref().unwrap().last().unwrap().clone();
    assert!(
        download.contains("--local-dir /models/llm"),
        "the example's download: {download}"
    );
    // The engine's script names its directory through the model's own variable, as NGC
    // engine scripts do (a variable of its own pointing into the landing would be one more
    // writer there, which admission refuses to mount a read-only copy over).
    let download = download.replace(
        "--local-dir /models/llm",
        "--local-dir \"$NGC_MODEL_MOUNT/llm\"",
    );
    let engine = spec
        .containers
        .iter_mut()
        .find(|c| c.name == "engine")
        .unwrap();
    let mut env = init.env.clone().unwrap_or_default();
    for (name, value) in [
        ("NGC_MODEL_NAME", "demo/llm:1"),
        ("NGC_MODEL_MOUNT", LANDING),
    ] {
        env.push(EnvVar {
            name: name.to_owned(),
            value: Some(value.to_owned()),
            value_from: None,
        });
    }
    engine.env = Some(env);
    engine.command = Some(vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!(
            "set -e; \
             if [ -f \"$NGC_MODEL_MOUNT/llm/SHA256SUMS\" ]; then echo 'model present'; else {download}; fi; \
             cd \"$NGC_MODEL_MOUNT/llm\" && sha256sum -c SHA256SUMS >/dev/null && touch /tmp/ready && exec sleep 2147483647"
        ),
    ]);
    workload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_downloads_by_itself_is_captured_after_ready_and_read_by_later_pods() {
    let started = Instant::now();
    let run = Scenario::new("capture")
        .model(model(16 << 20))
        .gpus(3)
        .node_agent()
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = run.client.clone();
    let workload = self_downloading(run.workload().unwrap());
    eprintln!("components Ready after {:.1?}", started.elapsed());
    let ns = run.namespace("e2e-capture", &[]).await.unwrap();
    if let Err(e) = webhook_serving(&client, &ns.name, &workload).await {
        panic!("{e}\n{}", run.report(&[]).await);
    }

    // One replica: admitted as a capture source, its own download untouched.
    let source = run
        .one_ready_replica(&ns, &workload)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pods = ns.api::<Pod>();
    assert_eq!(
        source.labels().get(CAPTURE_LABEL).map(String::as_str),
        Some("true"),
        "admitted as a capture source: {:?}",
        source.labels()
    );
    assert!(
        !source.labels().contains_key(ROLE_LABEL),
        "not a reader: {:?}",
        source.labels()
    );
    let source_spec = source.spec.clone().unwrap();
    assert!(
        source_spec.init_containers.is_none()
            && source_spec
                .volumes
                .iter()
                .flatten()
                .all(|v| v.persistent_volume_claim.is_none()),
        "the capture source keeps its own download: {source_spec:?}"
    );
    let binding = source.annotations()[BINDING_ANNOTATION].clone();
    eprintln!(
        "capture source {} Ready after {:.1?}",
        source.name_any(),
        started.elapsed()
    );

    // The node agent captures it; the binding controller completes the cache.
    let bindings = bindings_api(&client);
    let complete = eventually("the captured cache Ready", READY_TIMEOUT, || {
        let (bindings, binding) = (bindings.clone(), binding.clone());
        async move {
            let b = bindings.get(&binding).await.ok()?;
            let status = &b.data["status"];
            (status["realized"]["populationState"] == "Ready").then(|| status.clone())
        }
    })
    .await;
    let status = match complete {
        Ok(s) => s,
        Err(e) => panic!("{e}\n{}", run.report(&[ns.name.as_str()]).await),
    };
    let bytes = status["realized"]["bytes"].as_i64().unwrap_or_default();
    if let Some(model_bytes) = run.model_bytes() {
        assert!(
            bytes >= i64::try_from(model_bytes).unwrap(),
            "the captured copy holds the model ({model_bytes} bytes): {status}"
        );
    }
    eprintln!(
        "the cache is complete from the capture ({bytes} bytes) after {:.1?}",
        started.elapsed()
    );

    // Two more replicas: readers of the captured copy, read-only, no download.
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .patch(
            "llm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let readers = eventually("two readers Ready", READY_TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let readers: Vec<Pod> = app_pods(&pods)
                .await?
                .into_iter()
                .filter(|p| p.labels().get(ROLE_LABEL).map(String::as_str) == Some("reader"))
                .collect();
            (readers.len() == 2 && readers.iter().all(is_ready)).then_some(readers)
        }
    })
    .await;
    let Ok(readers) = readers else {
        panic!(
            "the later pods never read the captured copy\n{}",
            run.report(&[ns.name.as_str()]).await
        );
    };
    for reader in &readers {
        let name = reader.name_any();
        assert_eq!(
            reader.annotations().get(BINDING_ANNOTATION),
            Some(&binding),
            "{name} reads the captured cache"
        );
        assert!(
            !reader.labels().contains_key(CAPTURE_LABEL),
            "{name}: a reader, not a capture source"
        );
        let spec = reader.spec.as_ref().unwrap();
        let engine = spec.containers.iter().find(|c| c.name == "engine").unwrap();
        let mount = engine
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == LANDING)
            .unwrap_or_else(|| panic!("{name}: no mount at the landing: {engine:?}"));
        assert_eq!(mount.read_only, Some(true), "{name}: {mount:?}");
        let claim = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.persistent_volume_claim.clone())
            .unwrap_or_else(|| panic!("{name}: the landing is not a claim"));
        assert_eq!(claim.read_only, Some(true), "{name}: {claim:?}");
    }
    // The Hub served the model once: the capture source's own download.
    if let (Some(served), Some(model_bytes)) = (run.served(), run.model_bytes()) {
        assert_eq!(
            served, model_bytes,
            "the Hub served the model once for three pods"
        );
        eprintln!(
            "capture: 3 pods, the Hub served {served} bytes = 1.0x the model; the readers started {:.1?} after the test began",
            started.elapsed()
        );
    }
    run.finish().await;
}
