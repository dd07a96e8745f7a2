//! SIGTERM drains in-flight admission reviews: a review the real API server is waiting for when
//! the process receives SIGTERM is still answered (the write it guards succeeds), `/readyz`
//! turns 503 at once while the port keeps accepting for `--shutdown-delay`, and the port is
//! closed once the drain is over.
//!
//! Its own test binary: a signal reaches every runtime of a process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{http_get, runtime_args};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use warmcache_admission::registration::{FailurePolicy, Rule, SideEffects};
use warmcache_admission::{
    AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig, DynamicObject,
    Operation, Route, ServiceTarget, TlsFiles, Webhook,
};
use warmcache_runtime::{AdmissionArgs, Runtime};
use warmcache_testkit::{ControlPlane, TestNamespace, WebhookPki, eventually};

const WAIT: Duration = Duration::from_secs(30);
const SLOW: Duration = Duration::from_secs(3);

fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_an_admission_review_in_flight() {
    let plane = ControlPlane::shared().await.unwrap();
    let ns = TestNamespace::new("rt-sigterm").await.unwrap();
    let pki = WebhookPki::generate().unwrap();
    let certs = tempfile::tempdir().unwrap();
    std::fs::write(certs.path().join("tls.crt"), &pki.cert_pem).unwrap();
    std::fs::write(certs.path().join("tls.key"), &pki.key_pem).unwrap();

    let mut args = runtime_args(plane, Duration::from_secs(15));
    args.shutdown_delay = Duration::from_secs(2);
    let mut rt = Runtime::builder("runtime-sigterm", args)
        .build()
        .await
        .unwrap();
    let admin = rt.admin_addr();

    let started = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let (s, a) = (Arc::clone(&started), Arc::clone(&answered));
    let route = Route::validating_async(
        "/validate-slow",
        move |request: AdmissionRequest<DynamicObject>| {
            let (started, answered) = (Arc::clone(&s), Arc::clone(&a));
            async move {
                let slow = request.name.starts_with("slow");
                if slow {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(SLOW).await;
                }
                let response = AdmissionResponse::from(&request);
                if slow {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
                response
            }
        },
    )
    .webhook(
        Webhook::new("slow.runtime-sigterm.warmcache.io")
            .rule(Rule::for_resource::<ConfigMap>(vec![Operation::Create]))
            .failure_policy(FailurePolicy::Fail)
            .timeout_seconds(15)
            .side_effects(SideEffects::None)
            .namespace_selector(ns.selector()),
    );
    let server = AdmissionServer::new(AdmissionServerConfig::new(TlsFiles::in_dir(certs.path())))
        .route(route);
    let config = server
        .configurations(
            "runtime-sigterm",
            &ServiceTarget::new("unused", "unused", 443),
        )
        .unwrap();
    let listen = AdmissionArgs {
        tls_dir: certs.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
    };
    let addr = rt.serve_admission(&listen, server).await.unwrap();
    let config = config
        .with_url(&format!("https://{addr}"), pki.ca_pem.as_bytes())
        .validating
        .unwrap();
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
    configs
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let running = tokio::spawn(rt.run());
    eventually("/readyz to pass", WAIT, || async move {
        (http_get(admin, "/readyz").await.0 == 200).then_some(())
    })
    .await
    .unwrap();

    // Wait until the API server calls the webhook (registration takes a moment to apply).
    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    eventually("the webhook to be called", WAIT, || {
        let (cms, dry, started) = (cms.clone(), dry.clone(), Arc::clone(&started));
        async move {
            let before = started.load(Ordering::SeqCst);
            cms.create(&dry, &cm("slow-probe")).await.ok()?;
            (started.load(Ordering::SeqCst) > before).then_some(())
        }
    })
    .await
    .unwrap();
    let calls_before = started.load(Ordering::SeqCst);

    // A create waits for the slow review; SIGTERM arrives while it is in flight.
    let creating = {
        let cms = cms.clone();
        tokio::spawn(async move { cms.create(&PostParams::default(), &cm("slow-1")).await })
    };
    eventually("the review to be in flight", WAIT, || {
        let in_flight = started.load(Ordering::SeqCst) > calls_before;
        async move { in_flight.then_some(()) }
    })
    .await
    .unwrap();
    let answered_before = answered.load(Ordering::SeqCst);
    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    eventually(
        "/readyz to fail once the drain begins",
        WAIT,
        || async move {
            let (status, body) = http_get(admin, "/readyz").await;
            (status == 503 && body.contains("shutting down")).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        answered.load(Ordering::SeqCst),
        answered_before,
        "/readyz failed only after the review was answered: the test proves nothing"
    );
    // During --shutdown-delay the port still accepts new connections.
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_ok(),
        "the webhook port closed before the shutdown delay was over"
    );

    let created = creating.await.unwrap();
    assert!(
        created.is_ok(),
        "the review in flight at SIGTERM was not answered: {created:?}"
    );
    assert!(answered.load(Ordering::SeqCst) > answered_before);
    running.await.unwrap().unwrap();
    assert!(
        signalled.elapsed() < Duration::from_secs(15),
        "the drain took {:?}",
        signalled.elapsed()
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the webhook port still accepts after the drain"
    );
    configs
        .delete("runtime-sigterm", &DeleteParams::default())
        .await
        .unwrap();
    ns.cleanup().await;
}
