//! The admission server end to end over TLS: handlers, refusals, limits, timeouts, metrics.

// Test code: helpers outside #[test] fns may unwrap/panic too (clippy.toml only covers #[test]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use warmcache_admission::patch::{self, PatchBuilder};
use warmcache_admission::{
    AdmissionMetrics, AdmissionRequest, AdmissionResponse, AdmissionServer, AdmissionServerConfig,
    DynamicObject, OnHandlerError, Route, Verdict,
};

const VALIDATE: &str = "/validate-kvcachebackend";
const MUTATE: &str = "/mutate-pod";

fn validate_name(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let name = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.name.clone())
        .unwrap_or_default();
    if name == "bad" {
        AdmissionResponse::from(&req).deny("spec.tier: the name \"bad\" is not allowed")
    } else {
        AdmissionResponse::from(&req)
    }
}

fn annotate(req: AdmissionRequest<DynamicObject>) -> Result<AdmissionResponse, String> {
    let object =
        serde_json::to_value(req.object.as_ref().ok_or("no object")?).map_err(|e| e.to_string())?;
    let mut builder = PatchBuilder::new(&object);
    builder
        .set_annotation("nvca.nvcf.nvidia.io/model-cache", "binding-1")
        .map_err(|e| e.to_string())?;
    patch::allow_with_patch(&req, builder.build()).map_err(|e| e.to_string())
}

/// What the `/panics` and `/allow/panics` handlers panic with.
const HANDLER_BUG: &str = "handler bug";

/// Keeps the panics of the handlers that panic on purpose quiet. The default hook prints them,
/// with a backtrace under `RUST_BACKTRACE=1`, which on a loaded 2-core machine took longer than
/// the 500 ms handler timeout (1 run in 4): the review was then answered "did not answer
/// within" rather than "panicked". Every other panic goes to the default hook.
fn quiet_handler_bug_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            if message != Some(HANDLER_BUG) {
                default(info);
            }
        }));
    });
}

/// A server with the standard test routes, short timeouts and a 64 KiB body limit.
fn test_server(dir: &std::path::Path, metrics: Option<AdmissionMetrics>) -> AdmissionServer {
    quiet_handler_bug_panics();
    let mut config = AdmissionServerConfig::new(files_in(dir));
    config.max_body_bytes = 64 * 1024;
    config.body_timeout = Duration::from_millis(700);
    config.handler_timeout = Duration::from_millis(500);
    let mut server = AdmissionServer::new(config)
        .route(Route::validating(VALIDATE, validate_name))
        .route(Route::mutating(MUTATE, annotate))
        .route(Route::validating("/fails", |_req| {
            Err::<AdmissionResponse, _>("the catalog is unreachable")
        }))
        .route(Route::validating("/panics", |_req| -> AdmissionResponse {
            panic!("handler bug")
        }))
        .route(Route::validating_async("/hangs", |req| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            AdmissionResponse::from(&req)
        }))
        .route(Route::mutating_async("/async-allow", |req| async move {
            tokio::task::yield_now().await;
            AdmissionResponse::from(&req)
        }))
        .route(Route::validating("/validate-with-patch", annotate))
        // The same failures on routes that must never block the request.
        .route(
            Route::mutating("/allow/fails", |_req| {
                Err::<AdmissionResponse, _>("the catalog is unreachable")
            })
            .on_error(OnHandlerError::Allow),
        )
        .route(
            Route::mutating("/allow/panics", |_req| -> AdmissionResponse {
                panic!("handler bug")
            })
            .on_error(OnHandlerError::Allow),
        )
        .route(
            Route::mutating_async("/allow/hangs", |req| async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                AdmissionResponse::from(&req)
            })
            .on_error(OnHandlerError::Allow),
        )
        .route(
            Route::validating("/allow/validate-with-patch", annotate)
                .on_error(OnHandlerError::Allow),
        )
        .route(
            Route::validating_async("/deny/hangs", |req| async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                AdmissionResponse::from(&req)
            })
            .on_error(OnHandlerError::Deny),
        )
        // Healthy handler on an Allow route: its patch and denials pass through as usual.
        .route(Route::mutating("/allow/annotate", annotate).on_error(OnHandlerError::Allow))
        .route(
            Route::validating("/allow/validate-name", validate_name)
                .on_error(OnHandlerError::Allow),
        );
    if let Some(metrics) = metrics {
        server = server.with_metrics(metrics);
    }
    server
}

struct Fixture {
    _dir: tempfile::TempDir,
    ca: Ca,
    running: Running,
}

fn start(metrics: Option<AdmissionMetrics>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let running = spawn_serve(test_server(dir.path(), metrics));
    Fixture {
        _dir: dir,
        ca,
        running,
    }
}

#[tokio::test]
async fn valid_reviews_reach_handlers_over_http1_and_http2() {
    let f = start(None);
    for alpn in [b"h2".as_slice(), b"http/1.1".as_slice()] {
        // Allowed.
        let reply = post(
            f.running.addr,
            &f.ca,
            alpn,
            VALIDATE,
            Some("application/json"),
            serde_json::to_vec(&pod_review("uid-allow", "good")).unwrap(),
        )
        .await;
        assert_eq!(reply.alpn, alpn);
        assert_eq!(reply.content_type, "application/json");
        let response = reply.response();
        assert_eq!(response["uid"], "uid-allow");
        assert_eq!(response["allowed"], true);
        assert!(response.get("patch").is_none());

        // Denied with the handler's message.
        let reply = post(
            f.running.addr,
            &f.ca,
            alpn,
            VALIDATE,
            Some("application/json; charset=utf-8"),
            serde_json::to_vec(&pod_review("uid-deny", "bad")).unwrap(),
        )
        .await;
        let response = reply.response();
        assert_eq!(response["uid"], "uid-deny");
        assert_eq!(response["allowed"], false);
        assert_eq!(
            response["status"]["message"],
            "spec.tier: the name \"bad\" is not allowed"
        );
    }
    f.running.stop().await;
}

#[tokio::test]
async fn mutation_patch_comes_back_and_applies() {
    let f = start(None);
    let review = pod_review("uid-patch", "p");
    let reply = post(
        f.running.addr,
        &f.ca,
        b"h2",
        MUTATE,
        Some("application/json"),
        serde_json::to_vec(&review).unwrap(),
    )
    .await;
    let response = reply.response();
    assert_eq!(response["uid"], "uid-patch");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    // The patch bytes, as base64 text (Go's `[]byte` form, which the API server reads).
    let bytes = patch_bytes(&response);
    let ops: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        ops,
        json!([
            {"op": "add", "path": "/metadata/annotations", "value": {}},
            {"op": "add", "path": "/metadata/annotations/nvca.nvcf.nvidia.io~1model-cache",
             "value": "binding-1"}
        ])
    );
    let patch: patch::Patch = serde_json::from_value(ops).unwrap();
    let patched = patch::apply(&review["request"]["object"], &patch).unwrap();
    assert_eq!(
        patched["metadata"]["annotations"],
        json!({"nvca.nvcf.nvidia.io/model-cache": "binding-1"})
    );

    let reply = post_json(
        f.running.addr,
        &f.ca,
        "/async-allow",
        &pod_review("uid-async", "p"),
    )
    .await;
    assert_eq!(reply.response()["allowed"], true);
    f.running.stop().await;
}

#[tokio::test]
async fn handler_failures_become_denials_with_the_uid() {
    let f = start(None);
    for (path, needle) in [
        ("/fails", "the catalog is unreachable"),
        ("/panics", "panicked"),
        ("/hangs", "did not answer within"),
        ("/deny/hangs", "did not answer within"),
        (
            "/validate-with-patch",
            "validating handler returned a patch",
        ),
    ] {
        let started = Instant::now();
        let reply = post_json(f.running.addr, &f.ca, path, &pod_review("uid-err", "p")).await;
        let response = reply.response();
        assert_eq!(response["uid"], "uid-err", "{path}");
        assert_eq!(response["allowed"], false, "{path}");
        assert_eq!(response["status"]["code"], 500, "{path}");
        assert_eq!(response["status"]["reason"], "InternalError", "{path}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{path}: {message}");
        assert!(response.get("patch").is_none(), "{path}");
        assert!(response.get("warnings").is_none(), "{path}");
        assert!(started.elapsed() < Duration::from_secs(5), "{path}");
    }
    // The server survived the panic.
    let reply = post_json(
        f.running.addr,
        &f.ca,
        VALIDATE,
        &pod_review("uid-ok", "good"),
    )
    .await;
    assert_eq!(reply.response()["allowed"], true);
    f.running.stop().await;
}

#[tokio::test]
async fn handler_failures_on_allow_routes_let_the_request_through_unchanged() {
    let f = start(None);
    for (path, needle) in [
        ("/allow/fails", "the catalog is unreachable"),
        ("/allow/panics", "panicked"),
        ("/allow/hangs", "did not answer within"),
        (
            "/allow/validate-with-patch",
            "validating handler returned a patch",
        ),
    ] {
        for alpn in [b"h2".as_slice(), b"http/1.1".as_slice()] {
            let started = Instant::now();
            let reply = post(
                f.running.addr,
                &f.ca,
                alpn,
                path,
                Some("application/json"),
                serde_json::to_vec(&pod_review("uid-err", "bad")).unwrap(),
            )
            .await;
            let response = reply.response();
            assert_eq!(response["uid"], "uid-err", "{path}");
            assert_eq!(response["allowed"], true, "{path}: {response}");
            assert!(response.get("patch").is_none(), "{path}: {response}");
            assert!(response.get("patchType").is_none(), "{path}: {response}");
            assert_ne!(response["status"]["code"], 500, "{path}: {response}");
            let warnings = response["warnings"].as_array().unwrap();
            assert_eq!(warnings.len(), 1, "{path}: {response}");
            let warning = warnings[0].as_str().unwrap();
            assert!(warning.contains(path), "{path}: {warning}");
            assert!(warning.contains(needle), "{path}: {warning}");
            assert!(started.elapsed() < Duration::from_secs(5), "{path}");
        }
    }

    // A healthy handler on an Allow route answers as it likes: patch, denial, no warning.
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/allow/annotate",
        &pod_review("uid-patch", "p"),
    )
    .await
    .response();
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    assert!(response.get("warnings").is_none(), "{response}");
    let response = post_json(
        f.running.addr,
        &f.ca,
        "/allow/validate-name",
        &pod_review("uid-deny", "bad"),
    )
    .await
    .response();
    assert_eq!(response["allowed"], false);
    assert!(response.get("warnings").is_none(), "{response}");
    f.running.stop().await;
}

#[tokio::test]
async fn malformed_bodies_get_clear_refusals() {
    let f = start(None);
    let addr = f.running.addr;

    // Not JSON: no review to answer, 400 with a text reason.
    let reply = post(
        addr,
        &f.ca,
        b"h2",
        VALIDATE,
        Some("application/json"),
        b"{nope".to_vec(),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert!(reply.content_type.starts_with("text/plain"));
    assert!(reply.text().contains("not JSON"), "{}", reply.text());

    // Wrong kind: invalid response carrying the uid.
    let mut body = pod_review("uid-kind", "p");
    body["kind"] = json!("ConfigMap");
    let response = post_json(addr, &f.ca, VALIDATE, &body).await.response();
    assert_eq!(response["uid"], "uid-kind");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["reason"], "InvalidRequest");
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("ConfigMap")
    );

    // Wrong apiVersion.
    let mut body = pod_review("uid-v1beta1", "p");
    body["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let response = post_json(addr, &f.ca, MUTATE, &body).await.response();
    assert_eq!(response["uid"], "uid-v1beta1");
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("v1beta1") && message.contains("admissionReviewVersions"),
        "{message}"
    );

    // No request: still a well-formed reply, with an empty uid.
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let response = post_json(addr, &f.ca, VALIDATE, &body).await.response();
    assert_eq!(response["uid"], "");
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("no request")
    );

    // A request that does not decode names the field.
    let mut body = pod_review("uid-op", "p");
    body["request"]["operation"] = json!("EXPLODE");
    let response = post_json(addr, &f.ca, VALIDATE, &body).await.response();
    assert_eq!(response["uid"], "uid-op");
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("request.operation")
    );

    // Wrong or missing content type: 415.
    let json_body = serde_json::to_vec(&pod_review("uid-ct", "p")).unwrap();
    let reply = post(
        addr,
        &f.ca,
        b"http/1.1",
        VALIDATE,
        Some("text/plain"),
        json_body.clone(),
    )
    .await;
    assert_eq!(reply.status, 415, "{}", reply.text());
    assert!(reply.text().contains("application/json"));
    let reply = post(addr, &f.ca, b"h2", VALIDATE, None, json_body).await;
    assert_eq!(reply.status, 415, "{}", reply.text());

    // Unknown path and wrong method.
    let reply = post_json(addr, &f.ca, "/nowhere", &pod_review("u", "p")).await;
    assert_eq!(reply.status, 404);
    assert!(reply.text().contains("/nowhere"));
    let (text, _) = raw_http1(
        addr,
        &f.ca,
        b"GET /validate-kvcachebackend HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 405"), "{text}");
    f.running.stop().await;
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let f = start(None);
    // Padding inside a valid review, beyond the 64 KiB test limit (declared length).
    let mut body = pod_review("uid-big", "p");
    body["request"]["object"]["metadata"]["annotations"] = json!({"pad": "x".repeat(80 * 1024)});
    for alpn in [b"h2".as_slice(), b"http/1.1".as_slice()] {
        let reply = post(
            f.running.addr,
            &f.ca,
            alpn,
            VALIDATE,
            Some("application/json"),
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert_eq!(reply.status, 413, "{}", reply.text());
        assert!(reply.text().contains("65536"), "{}", reply.text());
    }

    // Chunked, without Content-Length: caught while reading.
    let chunk = "y".repeat(16 * 1024);
    let mut request =
        b"POST /validate-kvcachebackend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for _ in 0..5 {
        request.extend_from_slice(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let (text, _) = raw_http1(f.running.addr, &f.ca, &request, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");

    // Just under the limit is fine.
    body["request"]["object"]["metadata"]["annotations"] = json!({"pad": "x".repeat(32 * 1024)});
    let reply = post_json(f.running.addr, &f.ca, VALIDATE, &body).await;
    assert_eq!(reply.response()["allowed"], true);
    f.running.stop().await;
}

#[tokio::test]
async fn slow_clients_are_cut_off() {
    let f = start(None);
    // Body announced but never finished: 408 once the 700 ms body timeout passes, then close.
    let started = Instant::now();
    let (text, closed) = raw_http1(
        f.running.addr,
        &f.ca,
        b"POST /validate-kvcachebackend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 1000\r\n\r\n{\"apiVersion\":",
        Duration::from_secs(10),
    )
    .await;
    assert!(closed, "connection left open; got {text:?}");
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("not received within"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Headers never finished: the connection is closed by the header read timeout.
    let started = Instant::now();
    let (_, closed) = raw_http1(
        f.running.addr,
        &f.ca,
        b"POST /validate-kvcachebackend HTTP/1.1\r\nHost: x\r\n",
        Duration::from_secs(10),
    )
    .await;
    assert!(closed, "connection with unfinished headers left open");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // The server is still healthy.
    let reply = post_json(
        f.running.addr,
        &f.ca,
        VALIDATE,
        &pod_review("uid-after", "good"),
    )
    .await;
    assert_eq!(reply.response()["uid"], "uid-after");
    f.running.stop().await;
}

#[tokio::test]
async fn metrics_count_verdicts_per_route() {
    let registry = prometheus::Registry::new();
    let metrics = AdmissionMetrics::new().unwrap();
    metrics.register(&registry).unwrap();
    let f = start(Some(metrics.clone()));
    let addr = f.running.addr;

    post_json(addr, &f.ca, VALIDATE, &pod_review("a", "good")).await;
    post_json(addr, &f.ca, VALIDATE, &pod_review("b", "bad")).await;
    post_json(addr, &f.ca, VALIDATE, &json!({"kind": "AdmissionReview"})).await;
    post_json(addr, &f.ca, "/fails", &pod_review("c", "p")).await;
    post_json(addr, &f.ca, MUTATE, &pod_review("d", "p")).await;
    post_json(addr, &f.ca, "/allow/fails", &pod_review("e", "p")).await;

    let count = |route: &str, verdict: Verdict| {
        metrics
            .reviews()
            .with_label_values(&[route, verdict.as_str()])
            .get()
    };
    assert_eq!(count(VALIDATE, Verdict::Allowed), 1);
    assert_eq!(count(VALIDATE, Verdict::Denied), 1);
    assert_eq!(count(VALIDATE, Verdict::Invalid), 1);
    assert_eq!(count("/fails", Verdict::Error), 1);
    assert_eq!(count(MUTATE, Verdict::Allowed), 1);
    // A failure let through on an Allow route still counts as an error, not as allowed.
    assert_eq!(count("/allow/fails", Verdict::Error), 1);
    assert_eq!(count("/allow/fails", Verdict::Allowed), 0);
    assert_eq!(
        metrics
            .duration()
            .with_label_values(&[VALIDATE])
            .get_sample_count(),
        3
    );
    let names: Vec<String> = registry
        .gather()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert!(
        names.contains(&"warmcache_admission_reviews_total".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"warmcache_admission_review_duration_seconds".to_owned()),
        "{names:?}"
    );
    f.running.stop().await;
}

#[tokio::test]
async fn bad_routes_are_refused_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    Ca::new("ca").leaf(1).write_to(dir.path());
    let config = AdmissionServerConfig::new(files_in(dir.path()));
    let ok = |req: AdmissionRequest<DynamicObject>| AdmissionResponse::from(&req);

    let server = AdmissionServer::new(config.clone()).route(Route::validating("no-slash", ok));
    let err = server.router().unwrap_err();
    assert!(err.to_string().contains("no-slash"), "{err}");

    let server = AdmissionServer::new(config.clone()).route(Route::validating("/x/{id}", ok));
    assert!(server.router().is_err());

    let running = spawn_serve(
        AdmissionServer::new(config)
            .route(Route::validating("/same", ok))
            .route(Route::mutating("/same", ok)),
    );
    let err = running.task.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("more than once"), "{err}");
}

#[tokio::test]
async fn buffered_bodies_share_one_budget() {
    // Budget of one 48 KiB body; a review holding it (its handler hangs) makes the next one
    // wait for room, and give up with 503 at its body timeout; once the first is answered the
    // budget is free again.
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    ca.leaf(1).write_to(dir.path());
    let mut config = AdmissionServerConfig::new(files_in(dir.path()));
    config.max_body_bytes = 64 * 1024;
    config.max_buffered_body_bytes = 48 * 1024;
    config.body_timeout = Duration::from_millis(300);
    config.handler_timeout = Duration::from_secs(2);
    let server = AdmissionServer::new(config)
        .route(Route::validating(VALIDATE, validate_name))
        .route(Route::validating_async("/hangs", |req| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            AdmissionResponse::from(&req)
        }));
    let running = spawn_serve(server);
    let addr = running.addr;

    let mut big = pod_review("uid-holder", "p");
    big["request"]["object"]["metadata"]["annotations"] = json!({"pad": "x".repeat(40 * 1024)});
    let body = serde_json::to_vec(&big).unwrap();
    let holder = post(addr, &ca, b"h2", "/hangs", Some("application/json"), body);
    let mut waiting = pod_review("uid-waits", "good");
    waiting["request"]["object"]["metadata"]["annotations"] = json!({"pad": "x".repeat(20 * 1024)});
    let second = async {
        // The holder's body is read and its handler started well within this.
        tokio::time::sleep(Duration::from_millis(400)).await;
        post_json(addr, &ca, VALIDATE, &waiting).await
    };
    let (held, reply) = tokio::join!(holder, second);
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert!(reply.text().contains("49152 bytes"), "{}", reply.text());
    // The holder was answered at its handler timeout (denied), which freed its room.
    assert_eq!(held.response()["allowed"], false);
    let reply = post_json(addr, &ca, VALIDATE, &waiting).await;
    assert_eq!(reply.response()["allowed"], true, "{}", reply.text());
    running.stop().await;
}
