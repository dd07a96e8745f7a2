//! Properties over generated GPU pods (engines and init downloads of every recognised form, with
//! the settings real charts add: cache variables, scratch directories, tokens, mirrors, extra
//! repositories, sidecars, users) in generated contexts (sharing domains, storage, reader modes,
//! existing bindings):
//!
//! - admission never panics and is deterministic;
//! - it is idempotent: admitting the admitted pod again (with the binding the first admission
//!   created now found) changes nothing, and a rewritten pod is `Unchanged`;
//! - every container it adds is hardened; the copy is read-only on the pod side in every
//!   container that mounts it (except the in-place fallback of hostPath readers);
//! - a literal secret of the pod never appears in an annotation, an added container or a
//!   binding;
//! - the pod's own containers keep their names, images, commands and arguments.
//!
//! Runs are reproducible under `PROPTEST_RNG_SEED` (`hack/test.sh` sets one).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use proptest::prelude::*;
use serde_json::{Value, json};
use warmcache_api_modelcache::SHARING_DOMAIN_LABEL;
use warmcache_api_modelcache::v2beta1::{BindingPhase, ModelCacheBinding};
use warmcache_modelvolume::keys::{MODEL_VOLUME, OPT_OUT, SEED_CONTAINER, WAIT_CONTAINER};
use warmcache_modelvolume::{BindingAction, ReaderMode, Verdict};

#[derive(Debug, Clone)]
struct Shape {
    form: usize,
    hf_home: Option<&'static str>,
    volume: usize,
    extra: usize,
    prometheus_tmp: bool,
    token: Option<String>,
    token_in_init: bool,
    secret_ref: bool,
    mirror: bool,
    user: Option<i64>,
    sidecar: usize,
    init_before: bool,
    gpu: bool,
    opt_out: bool,
}

#[derive(Debug, Clone)]
struct Context {
    domain: Option<&'static str>,
    storage: &'static str,
    host_path: bool,
    binding: usize,
    /// Compile-cache sets on.
    sets: bool,
}

const FORMS: usize = 11;

fn shape() -> impl Strategy<Value = Shape> {
    (
        (
            0..FORMS,
            prop::option::of(prop::sample::select(vec![
                "/models/hf",
                "/tmp",
                "/data",
                "/models",
                "/root/.cache",
                "/workspace/hf",
            ])),
            0..4usize,
            0..8usize,
            any::<bool>(),
            prop::option::of("[A-Za-z0-9]{24}".prop_map(|s| format!("hf_{s}"))),
            any::<bool>(),
        ),
        (
            any::<bool>(),
            prop::bool::weighted(0.2),
            prop::option::of(prop::sample::select(vec![0i64, 1000])),
            0..3usize,
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.05),
        ),
    )
        .prop_map(
            |(
                (form, hf_home, volume, extra, prometheus_tmp, token, token_in_init),
                (secret_ref, mirror, user, sidecar, init_before, gpu, opt_out),
            )| Shape {
                form,
                hf_home,
                volume,
                extra,
                prometheus_tmp,
                token,
                token_in_init,
                secret_ref,
                mirror,
                user,
                sidecar,
                init_before,
                gpu,
                opt_out,
            },
        )
}

fn context() -> impl Strategy<Value = Context> {
    (
        prop::option::of(prop::sample::select(vec!["research", "prod"])),
        prop::sample::select(vec!["weka", "weka", "nvmesh", "lustre", "absent"]),
        any::<bool>(),
        0..4usize,
        any::<bool>(),
    )
        .prop_map(|(domain, storage, host_path, binding, sets)| Context {
            domain,
            storage,
            host_path,
            binding,
            sets,
        })
}

fn env(name: &str, value: &str) -> Value {
    json!({"name": name, "value": value})
}

fn build(s: &Shape) -> Pod {
    let mut main = json!({
        "name": "engine",
        "image": "vllm/vllm-openai:v0.20.0",
        "env": [],
        "volumeMounts": [],
    });
    let mut inits: Vec<Value> = Vec::new();
    let mut init = json!({"name": "fetch", "image": "python:3.12", "env": [], "volumeMounts": [{"name": "m", "mountPath": "/models"}]});
    let extra_args: Vec<&str> = match s.extra {
        1 => vec!["--tokenizer", "Qwen/Qwen3-8B"],
        2 => vec!["--tokenizer", "org/other-tokenizer"],
        3 => vec![
            "--speculative-config",
            r#"{"method": "ngram", "num_speculative_tokens": 4}"#,
        ],
        4 => vec!["--speculative-config", r#"{"model": "Qwen/Qwen3-0.6B"}"#],
        5 => vec!["--enable-lora", "--lora-modules", "a=/adapters/a"],
        6 => vec!["--enable-lora", "--lora-modules", "a=org/adapter"],
        _ => vec![],
    };
    match s.form {
        0 => {
            let mut a = vec!["--model", "Qwen/Qwen3-8B"];
            a.extend(extra_args);
            main["args"] = json!(a);
        }
        1 => {
            let mut script = "vllm serve Qwen/Qwen3-8B --revision v1".to_owned();
            for a in &extra_args {
                script.push_str(&format!(" '{a}'"));
            }
            main["command"] = json!(["sh", "-c", script]);
        }
        2 => {
            main["image"] = json!("ghcr.io/huggingface/text-generation-inference:3.3.4");
            main["env"]
                .as_array_mut()
                .unwrap()
                .push(env("MODEL_ID", "mistralai/Mistral-7B-Instruct-v0.3"));
        }
        3 => {
            main["image"] = json!("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.3");
            main["env"]
                .as_array_mut()
                .unwrap()
                .push(env("NIM_MODEL_PROFILE", "tensorrt_llm-h100-fp8"));
        }
        4 => {
            main["image"] = json!("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.3");
        }
        5 => {
            main["image"] = json!("kserve/huggingfaceserver:v0.15.0");
            main["args"] = json!([
                "--model_name=q",
                "--model_id=Qwen/Qwen3-8B",
                "--model_revision=abc"
            ]);
        }
        6 => {
            init["command"] = json!([
                "hf",
                "download",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--local-dir",
                "/models/llama"
            ]);
            let mut a = vec!["--model", "/models/llama"];
            a.extend(extra_args);
            main["args"] = json!(a);
            inits.push(init.clone());
        }
        7 => {
            init["command"] = json!(["hf", "download", "meta-llama/Llama-3.1-8B-Instruct"]);
            init["env"]
                .as_array_mut()
                .unwrap()
                .push(env("HF_HOME", s.hf_home.unwrap_or("/models")));
            main["args"] = json!(["--model", "meta-llama/Llama-3.1-8B-Instruct"]);
            inits.push(init.clone());
        }
        8 => {
            init["image"] = json!("amazon/aws-cli:2.17.0");
            init["args"] = json!(["s3", "sync", "s3://bucket/models/llama/", "/models"]);
            main["args"] = json!(["--model", "/models"]);
            inits.push(init.clone());
        }
        9 => {
            init["name"] = json!("storage-initializer");
            init["image"] = json!("kserve/storage-initializer:v0.15.0");
            init["args"] = json!(["hf://Qwen/Qwen3-0.6B", "/models"]);
            main["args"] = json!(["--model_dir=/models"]);
            inits.push(init.clone());
        }
        _ => {
            init["image"] = json!("nvcr.io/nvidia/ngc-cli:3.41.4");
            init["command"] = json!([
                "ngc",
                "registry",
                "model",
                "download-version",
                "--dest",
                "/models",
                "org/team/model:1"
            ]);
            main["env"]
                .as_array_mut()
                .unwrap()
                .push(env("MODEL_PATH", "/models/model_v1"));
            inits.push(init.clone());
        }
    }
    if let Some(h) = s.hf_home {
        main["env"].as_array_mut().unwrap().push(env("HF_HOME", h));
    }
    if s.prometheus_tmp {
        main["env"]
            .as_array_mut()
            .unwrap()
            .push(env("PROMETHEUS_MULTIPROC_DIR", "/tmp"));
    }
    if let Some(t) = &s.token {
        let target = if s.token_in_init && !inits.is_empty() {
            &mut inits[0]
        } else {
            &mut main
        };
        target["env"]
            .as_array_mut()
            .unwrap()
            .push(env("HF_TOKEN", t));
    }
    if s.secret_ref {
        main["env"].as_array_mut().unwrap().push(json!({"name": "HUGGING_FACE_HUB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}));
    }
    if s.mirror {
        main["env"]
            .as_array_mut()
            .unwrap()
            .push(env("HF_ENDPOINT", "https://hf-mirror.internal"));
    }
    if let Some(u) = s.user {
        main["securityContext"] = json!({"runAsUser": u});
    }
    let mut volumes = vec![];
    match s.volume {
        0 => {
            main["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "m", "mountPath": "/models"}));
            volumes.push(json!({"name": "m", "emptyDir": {}}));
        }
        1 => {
            if !inits.is_empty() {
                main["volumeMounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "m", "mountPath": "/models"}));
                volumes.push(json!({"name": "m", "emptyDir": {}}));
            }
        }
        2 => {
            main["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "m", "mountPath": "/models"}));
            volumes
                .push(json!({"name": "m", "persistentVolumeClaim": {"claimName": "team-models"}}));
        }
        _ => {
            main["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "m", "mountPath": "/models"}));
            main["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "d", "mountPath": "/data"}));
            volumes.push(json!({"name": "m", "emptyDir": {}}));
            volumes.push(json!({"name": "d", "emptyDir": {}}));
        }
    }
    if s.extra == 5 {
        main["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "adapters", "mountPath": "/adapters", "readOnly": true}));
        volumes
            .push(json!({"name": "adapters", "persistentVolumeClaim": {"claimName": "adapters"}}));
    }
    if s.gpu {
        main["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    }
    let mut containers = vec![main];
    if s.sidecar > 0 && volumes.iter().any(|v| v["name"] == "m") {
        containers.push(json!({
            "name": "sidecar",
            "image": "busybox:1.36",
            "volumeMounts": [{"name": "m", "mountPath": "/models", "readOnly": s.sidecar == 1}],
        }));
    }
    if s.init_before {
        inits.insert(
            0,
            json!({"name": "prepare", "image": "busybox:1.36", "command": ["true"]}),
        );
    }
    let mut labels = json!({"app": "x"});
    if s.opt_out {
        labels[OPT_OUT] = json!("true");
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": labels},
        "spec": {"initContainers": inits, "containers": containers, "volumes": volumes},
    }))
    .unwrap()
}

fn labels(c: &Context) -> BTreeMap<String, String> {
    c.domain
        .map(|d| BTreeMap::from([(SHARING_DOMAIN_LABEL.to_owned(), d.to_owned())]))
        .unwrap_or_default()
}

fn check_hardened(c: &Container) -> Result<(), TestCaseError> {
    let sc = c.security_context.as_ref().unwrap();
    prop_assert_eq!(sc.allow_privilege_escalation, Some(false));
    prop_assert_eq!(sc.run_as_non_root, Some(true));
    prop_assert!(sc.run_as_user.unwrap_or(0) > 0);
    prop_assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    prop_assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()])
    );
    let r = c.resources.as_ref().unwrap();
    prop_assert!(
        r.requests
            .as_ref()
            .is_some_and(|m| m.contains_key("cpu") && m.contains_key("memory"))
    );
    prop_assert!(
        r.limits
            .as_ref()
            .is_some_and(|m| m.contains_key("cpu") && m.contains_key("memory"))
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn admission_is_idempotent_safe_and_never_leaks_a_secret(s in shape(), c in context()) {
        let pod = build(&s);
        let labels = labels(&c);
        let mut options = common::options(c.host_path.then_some("hostPath"));
        options.compile_cache_sets = c.sets;
        let first = common::run(&pod, &labels, None, &options, c.storage, None);
        prop_assert_eq!(&first, &common::run(&pod, &labels, None, &options, c.storage, None), "deterministic");
        // Against an existing binding in the generated state.
        let (verdict, found) = match &first {
            Verdict::Rewrite(r) => match &r.binding {
                BindingAction::Create(b) => {
                    let phase = [None, Some(BindingPhase::Active), Some(BindingPhase::Retiring), Some(BindingPhase::Active)][c.binding];
                    let found = common::stored(b, phase, (c.binding == 3).then_some(common::NAMESPACE));
                    (common::run(&pod, &labels, None, &options, c.storage, Some(&found)), Some(found))
                }
                BindingAction::Join { .. } => (first.clone(), None),
            },
            _ => (first.clone(), None),
        };
        // With a compile-cache set: both bindings stored (the set in the same generated state).
        let (verdict, set_found) = match (&first, &found) {
            (Verdict::Rewrite(r), Some(model)) => match &r.cache_set {
                Some(BindingAction::Create(b)) => {
                    let phase = [None, Some(BindingPhase::Active), Some(BindingPhase::Retiring), Some(BindingPhase::Active)][c.binding];
                    let set = common::stored(b, phase, (c.binding == 3).then_some(common::NAMESPACE));
                    (common::run_named(&pod, &labels, &options, c.storage, &[model, &set]), Some(set))
                }
                _ => (verdict, None),
            },
            _ => (verdict, None),
        };
        let admitted = verdict.admitted(&pod);
        let stored: Vec<&ModelCacheBinding> = found.iter().chain(set_found.iter()).collect();
        let again = common::run_named(&admitted, &labels, &options, c.storage, &stored);
        prop_assert_eq!(again.admitted(&admitted), admitted.clone(), "idempotent");
        if let Verdict::Rewrite(r) = &verdict {
            prop_assert!(matches!(again, Verdict::Unchanged(_)));
            let spec = r.pod.spec.as_ref().unwrap();
            let waits: Vec<&Container> = spec.init_containers.iter().flatten().filter(|c| c.name == WAIT_CONTAINER).collect();
            prop_assert_eq!(waits.len(), 1);
            check_hardened(waits[0])?;
            for seed in spec.init_containers.iter().flatten().filter(|c| c.name == SEED_CONTAINER) {
                check_hardened(seed)?;
            }
            if !c.sets {
                prop_assert!(r.cache_set.is_none() && r.plan.cache_set().is_none());
            }
            let v = serde_json::to_value(&r.pod).unwrap();
            let volume = v["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == MODEL_VOLUME).cloned().unwrap();
            if r.reader_mode == ReaderMode::Pvc {
                prop_assert_eq!(&volume["persistentVolumeClaim"]["readOnly"], &json!(true));
            }
            for list in ["initContainers", "containers"] {
                for ctr in v["spec"][list].as_array().into_iter().flatten() {
                    for m in ctr["volumeMounts"].as_array().into_iter().flatten() {
                        if m["name"] == MODEL_VOLUME {
                            let fallback = ctr["name"] == WAIT_CONTAINER && r.reader_mode == ReaderMode::HostPath && ctr["args"][6] == "1";
                            prop_assert_eq!(&m["readOnly"], &json!(!fallback), "{}", m);
                        }
                    }
                }
            }
            prop_assert_eq!(common::valid(&r.pod), Ok(()));
            // The pod's own containers are kept.
            let before = pod.spec.as_ref().unwrap();
            prop_assert_eq!(before.containers.len(), spec.containers.len());
            for (b, a) in before.containers.iter().zip(&spec.containers) {
                prop_assert_eq!(&b.name, &a.name);
                prop_assert_eq!(&b.image, &a.image);
                prop_assert_eq!(&b.command, &a.command);
                prop_assert_eq!(&b.args, &a.args);
            }
        }
        if let Some(token) = &s.token {
            let annotations = serde_json::to_string(&admitted.metadata.annotations).unwrap();
            prop_assert!(!annotations.contains(token.as_str()), "token in annotations: {}", annotations);
            if let Verdict::Rewrite(r) = &verdict {
                let spec = r.pod.spec.as_ref().unwrap();
                for w in spec.init_containers.iter().flatten().filter(|c| c.name == WAIT_CONTAINER) {
                    let text = serde_json::to_string(w).unwrap();
                    // The in-place fallback of a hostPath reader is the pod's own init container,
                    // whose literal value it already held; anything else must not carry it.
                    let is_pods_own = r.reader_mode == ReaderMode::HostPath && s.token_in_init;
                    prop_assert!(is_pods_own || !text.contains(token.as_str()), "token copied into {}", text);
                }
                if let BindingAction::Create(b) = &r.binding {
                    prop_assert!(!serde_json::to_string(b).unwrap().contains(token.as_str()));
                }
                if let Some(BindingAction::Create(b)) = &r.cache_set {
                    prop_assert!(!serde_json::to_string(b).unwrap().contains(token.as_str()));
                }
                for seed in spec.init_containers.iter().flatten().filter(|c| c.name == SEED_CONTAINER) {
                    prop_assert!(!serde_json::to_string(seed).unwrap().contains(token.as_str()));
                }
            }
        }
        if s.opt_out || !s.gpu {
            prop_assert!(verdict.skip().is_some_and(|k| !k.reason.in_scope()));
            prop_assert_eq!(&admitted, &pod);
        }
    }
}

#[test]
fn the_generator_reaches_rewrites_and_skips() {
    // A guard that the property above is not vacuous: the shapes it generates cover rewrites
    // of every downloader form and several skip reasons.
    let mut rewrites = 0;
    let mut reasons = std::collections::BTreeSet::new();
    for (form, volume, extra, hf_home) in (0..FORMS).flat_map(|f| {
        (0..4).flat_map(move |v| {
            (0..8).flat_map(move |e| {
                [None, Some("/tmp"), Some("/models/hf")].map(move |h| (f, v, e, h))
            })
        })
    }) {
        {
            let s = Shape {
                form,
                hf_home,
                volume,
                extra,
                prometheus_tmp: false,
                token: None,
                token_in_init: false,
                secret_ref: false,
                mirror: false,
                user: None,
                sidecar: 0,
                init_before: false,
                gpu: true,
                opt_out: false,
            };
            match common::run(
                &build(&s),
                &BTreeMap::new(),
                None,
                &common::options(None),
                "weka",
                None,
            ) {
                Verdict::Rewrite(_) => rewrites += 1,
                Verdict::Skip(k) => {
                    reasons.insert(k.reason.code());
                }
                Verdict::Unchanged(_) => {}
            }
        }
    }
    assert!(rewrites >= 100, "{rewrites} rewrites");
    for r in [
        "multiple-repositories",
        "landing-shared",
        "landing-not-substitutable",
        "nim-profile-unpinned",
    ] {
        assert!(reasons.contains(r), "{r} not reached: {reasons:?}");
    }
}
