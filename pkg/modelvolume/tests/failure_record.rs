//! Admission of a pod whose binding recorded a failed download: refused (the pod downloads on
//! its own) only while the failure record holds at the admission's time; joined again after.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use warmcache_api_modelcache::v2beta1::{BindingPhase, FailureRecord, PopulationState};
use warmcache_modelvolume::{
    BindingAction, Options, Request, SkipReason, Verdict, admit, admit_at,
};

fn engine_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "qwen" },
        "spec": {
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.20.0",
                "args": ["--model", "Qwen/Qwen3-8B"],
                "env": [{ "name": "HF_HOME", "value": "/models/hf" }],
                "resources": { "limits": { "nvidia.com/gpu": "1" } },
                "volumeMounts": [{ "name": "m", "mountPath": "/models" }],
            }],
            "volumes": [{ "name": "m", "emptyDir": {} }],
        },
    }))
    .unwrap()
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

#[test]
fn a_failure_record_refuses_joins_only_until_it_expires() {
    let pod = engine_pod();
    let labels = BTreeMap::new();
    let options = Options::default();
    let sc = common::storage_class_for("weka");
    let storage = common::inputs(sc.as_ref());
    let req = Request {
        pod: &pod,
        namespace: common::NAMESPACE,
        namespace_labels: &labels,
        leader_worker_set: None,
        traceparent: None,
        options: &options,
    };
    let Verdict::Rewrite(first) = admit_at(&req, |_, _| None, &storage, at(0)) else {
        panic!("a new binding")
    };
    let BindingAction::Create(wanted) = &first.binding else {
        panic!("{:?}", first.binding)
    };
    let mut failed = common::stored(wanted, Some(BindingPhase::Active), Some(common::NAMESPACE));
    let status = failed.status.as_mut().unwrap();
    status.realized.as_mut().unwrap().population_state = Some(PopulationState::Failed);
    status.failure_record = Some(FailureRecord {
        failed_at: Time(at(0)),
        retry_after: Time(at(3600)),
        job_uid: Some("job-1".into()),
        message: "401 Unauthorized".into(),
    });
    // It holds until retryAfter plus the clock-skew margin (30 s).
    assert_eq!(
        warmcache_modelvolume::lifecycle::FAILURE_RECORD_CLOCK_MARGIN_SECONDS,
        30
    );
    for now in [at(1), at(3599), at(3600), at(3629)] {
        match admit_at(&req, |_, _| Some(&failed), &storage, now) {
            Verdict::Skip(s) => {
                assert_eq!(s.reason, SkipReason::DownloadFailed);
                assert!(s.message.contains(&at(3600).to_string()), "{}", s.message);
                assert!(s.message.contains(&at(3630).to_string()), "{}", s.message);
            }
            other => panic!("{other:?}"),
        }
    }
    // Expired, margin included: joined again (the controller retries).
    for now in [at(3630), at(7200)] {
        match admit_at(&req, |_, _| Some(&failed), &storage, now) {
            Verdict::Rewrite(r) => assert!(matches!(r.binding, BindingAction::Join { .. })),
            other => panic!("{other:?}"),
        }
    }
    // Without a clock the record holds.
    assert!(matches!(
        admit(&req, |_, _| Some(&failed), &storage),
        Verdict::Skip(s) if s.reason == SkipReason::DownloadFailed
    ));
    // A retry in progress after expiry (Populating, the expired record kept): joined.
    let mut retrying = failed.clone();
    retrying
        .status
        .as_mut()
        .unwrap()
        .realized
        .as_mut()
        .unwrap()
        .population_state = Some(PopulationState::Populating);
    assert!(matches!(
        admit_at(&req, |_, _| Some(&retrying), &storage, at(4000)),
        Verdict::Rewrite(_)
    ));
    // Failed without any record (stored before records existed): refused at any time.
    let mut legacy = failed.clone();
    legacy.status.as_mut().unwrap().failure_record = None;
    assert!(matches!(
        admit_at(&req, |_, _| Some(&legacy), &storage, at(999_999)),
        Verdict::Skip(s) if s.reason == SkipReason::DownloadFailed
    ));
}
