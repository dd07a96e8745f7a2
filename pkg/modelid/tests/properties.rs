//! Property tests: identities round-trip through their URI; resolution never panics on arbitrary
//! pod specs (containers with random argv, shell strings, env, mounts and volumes) and answers the
//! same thing every time; the shell reader never panics on any string; pods built to blow up
//! (doubling scripts and `$(V)` chains, deep nesting, many exports, huge values) cost a bounded
//! amount of work and give a report no larger than a constant factor of the pod plus a constant.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIVolumeSource, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HostPathVolumeSource, ImageVolumeSource, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodTemplateSpec, ResourceRequirements, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use proptest::prelude::*;
use warmcache_modelid::{
    Identity, LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL, LeaderWorkerSet, LeaderWorkerSetSpec,
    LeaderWorkerTemplate, MAX_COMMANDS, MAX_EXPANSION_BYTES, OPT_OUT_ANNOTATION, Outcome, Scheme,
    debug_resolve_cost, debug_shell_commands, resolve, resolve_with_group,
};

// ------------------------------------------------------------------------------------------------
// Identities
// ------------------------------------------------------------------------------------------------

fn hf_part() -> impl Strategy<Value = String> {
    "[A-Za-z0-9]([A-Za-z0-9_]|[-.][A-Za-z0-9_]){0,20}"
}

fn identity() -> impl Strategy<Value = Identity> {
    let hf = (
        proptest::option::of(hf_part()),
        hf_part(),
        proptest::option::of("[A-Za-z0-9._/-]{1,40}"),
    )
        .prop_map(|(org, name, rev)| {
            let repo = org.map_or(name.clone(), |o| format!("{o}/{name}"));
            Identity::hf(&repo, rev.as_deref()).unwrap()
        });
    let ngc = (
        "[a-z0-9_]{1,12}",
        proptest::option::of("[a-z0-9_]{1,12}"),
        "[a-z0-9_.-]{1,20}",
        "[A-Za-z0-9_.-]{1,12}",
    )
        .prop_map(|(org, team, model, ver)| {
            let path = team.map_or(format!("{org}/{model}"), |t| format!("{org}/{t}/{model}"));
            Identity::ngc(&format!("{path}:{ver}")).unwrap()
        });
    let bucket = (
        "[a-z0-9][a-z0-9.-]{2,20}",
        "(/[A-Za-z0-9@=+_.-]{1,12}){0,4}/?",
    )
        .prop_map(|(b, k)| format!("{b}{k}"));
    let s3 = bucket
        .clone()
        .prop_map(|r| Identity::new(Scheme::S3, &r, None, None).unwrap());
    let gs = bucket.prop_map(|r| Identity::new(Scheme::Gs, &r, None, None).unwrap());
    let image = (
        "[a-z0-9.-]{1,12}(:[0-9]{2,5})?/[a-z0-9/_-]{1,24}",
        proptest::option::of(":[A-Za-z0-9._-]{1,10}"),
        proptest::option::of("@sha256:[0-9a-f]{64}"),
    )
        .prop_map(|(r, t, d)| format!("{r}{}{}", t.unwrap_or_default(), d.unwrap_or_default()));
    let oci = image
        .clone()
        .prop_map(|r| Identity::new(Scheme::Oci, &r, None, None).unwrap());
    let nim = (image, proptest::option::of("[A-Za-z0-9_.-]{1,64}"))
        .prop_map(|(i, p)| Identity::nim(&i, p.as_deref()).unwrap());
    let path = "(/[A-Za-z0-9 @:_.-]{0,10}){1,5}"
        .prop_filter_map("valid path identity", |p| Identity::path(&p).ok());
    prop_oneof![hf, ngc, s3, gs, oci, nim, path]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn identity_uri_round_trips(id in identity()) {
        let uri = id.uri();
        let back = Identity::parse(&uri).unwrap();
        prop_assert_eq!(&back, &id);
        prop_assert_eq!(back.uri(), uri);
    }

    #[test]
    fn parsing_any_string_is_total_and_canonical(s in ".{0,60}", scheme in prop::sample::select(vec!["hf", "ngc", "s3", "gs", "oci", "nim", "path", "x"])) {
        for text in [s.clone(), format!("{scheme}://{s}")] {
            if let Ok(id) = Identity::parse(&text) {
                let again = Identity::parse(&id.uri()).unwrap();
                prop_assert_eq!(again, id);
            }
        }
    }

    #[test]
    fn shell_reader_never_panics(s in "(.|\n){0,200}") {
        let _ = debug_shell_commands(&s, &[("A", "x y"), ("HF_HOME", "/h")]);
    }

    #[test]
    fn shell_reader_never_panics_on_shell_like_text(words in prop::collection::vec(shell_word(), 0..30)) {
        let s = words.join(" ");
        let _ = debug_shell_commands(&s, &[("MODEL", "org/m"), ("DEST", "/d")]);
    }
}

// ------------------------------------------------------------------------------------------------
// Pods
// ------------------------------------------------------------------------------------------------

const VOCAB: &[&str] = &[
    "vllm",
    "serve",
    "--model",
    "--model-path",
    "--model-id",
    "--revision",
    "--download-dir",
    "hf",
    "download",
    "huggingface-cli",
    "--local-dir",
    "--cache-dir",
    "--include",
    "--repo-type",
    "ngc",
    "registry",
    "model",
    "download-version",
    "--dest",
    "--file",
    "aws",
    "s3",
    "sync",
    "cp",
    "s5cmd",
    "gsutil",
    "gcloud",
    "storage",
    "-m",
    "-r",
    "sh",
    "bash",
    "-c",
    "-lc",
    "-euo",
    "pipefail",
    "exec",
    "env",
    "tini",
    "--",
    "nohup",
    "&&",
    "||",
    ";",
    "|",
    ">",
    "2>&1",
    "&",
    "<<EOF",
    "EOF",
    "\n",
    "cd",
    "export",
    "A=b",
    "HF_HOME=/x",
    "$MODEL",
    "${HF_HOME}",
    "${M:-org/d}",
    "$(X)",
    "$(cat f)",
    "`id`",
    "'",
    "\"",
    "\\",
    "Qwen/Qwen3-0.6B",
    "org/team/model:1",
    "s3://b/k/",
    "s3://b/k/*",
    "gs://g/p",
    "hf://a/b@c",
    "pvc://x/y",
    "https://h/x",
    "/models",
    "/models/x",
    "/mnt/models",
    "/root/.cache/huggingface",
    ".",
    "..",
    "./rel",
    "python3",
    "-m",
    "sglang.launch_server",
    "dynamo.vllm",
    "vllm.entrypoints.openai.api_server",
    "ray",
    "start",
    "--head",
    "if",
    "then",
    "fi",
    "for",
    "do",
    "done",
    "{",
    "}",
    "(",
    ")",
    "#",
    "=",
    "--model=$(M)",
    "--revision=v1",
    "--dest=/d",
    "$",
    "${",
    "$(",
];

fn shell_word() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(VOCAB).prop_map(str::to_owned),
        2 => ".{0,8}",
    ]
}

/// Well-formed commands, so that random mixing reaches every recogniser.
const SNIPPETS: &[&str] = &[
    "hf download Qwen/Qwen3-0.6B --local-dir /models/x",
    "huggingface-cli download --revision v2 org/m --local-dir $DEST",
    "ngc registry model download-version org/team/model:1 --dest /models",
    "aws s3 sync s3://b/k/ /models",
    "s5cmd --numworkers 8 cp s3://b/k/* /data",
    "gsutil -m cp -r gs://g/p /data",
    "gcloud storage cp -r gs://g/p /mnt/models",
    "vllm serve $MODEL --download-dir /data",
    "python3 -m sglang.launch_server --model-path org/m --tp 2",
];

fn arg() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => shell_word(),
        2 => prop::collection::vec(shell_word(), 1..14).prop_map(|w| w.join(" ")),
        2 => prop::sample::select(SNIPPETS).prop_map(str::to_owned),
        2 => (prop::sample::select(SNIPPETS), prop::collection::vec(shell_word(), 0..4), prop::sample::select(&[" && ", "; ", " | ", "\n"][..]))
            .prop_map(|(s, w, sep)| format!("{} {sep} {s}", w.join(" "))),
    ]
}

const ENV_NAMES: &[&str] = &[
    "MODEL",
    "M",
    "X",
    "DEST",
    "HF_HOME",
    "HF_HUB_CACHE",
    "MODEL_PATH",
    "MODEL_ID",
    "HF_MODEL_ID",
    "NGC_MODEL_NAME",
    "NGC_MODEL_MOUNT",
    "NGC_STABLE_MODEL_PATH",
    "NIM_CACHE_PATH",
    "NIM_MODEL_PROFILE",
    "NIM_MODEL_NAME",
];

fn env_var() -> impl Strategy<Value = EnvVar> {
    (
        prop::sample::select(ENV_NAMES),
        proptest::option::of(arg()),
        any::<bool>(),
    )
        .prop_map(|(name, value, from)| EnvVar {
            name: name.to_owned(),
            value: if from { None } else { value },
            value_from: from.then(|| EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
}

const VOLUMES: &[&str] = &["a", "b", "c", "d"];
const PATHS: &[&str] = &[
    "/models",
    "/models/x",
    "/root/.cache/huggingface",
    "/root/.cache",
    "/mnt/models",
    "/data",
    "/",
    "/dev/shm",
    "/var/run/secrets/x",
    "/opt/nim/.cache",
    "rel",
    "",
];

fn mount() -> impl Strategy<Value = VolumeMount> {
    (
        prop::sample::select(VOLUMES),
        prop_oneof![4 => prop::sample::select(PATHS).prop_map(str::to_owned), 1 => ".{0,10}"],
        proptest::option::of(prop_oneof![
            Just("models".to_owned()),
            Just("a/b".to_owned()),
            ".{0,6}"
        ]),
        proptest::option::of(Just("$(POD)".to_owned())),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(
            |(name, path, sub_path, sub_path_expr, read_only)| VolumeMount {
                name: name.to_owned(),
                mount_path: path,
                sub_path,
                sub_path_expr,
                read_only,
                ..Default::default()
            },
        )
}

fn volume() -> impl Strategy<Value = Volume> {
    (prop::sample::select(VOLUMES), 0..7u8, "[a-z0-9-]{0,12}").prop_map(|(name, kind, claim)| {
        let mut v = Volume {
            name: name.to_owned(),
            ..Default::default()
        };
        match kind {
            0 => v.empty_dir = Some(EmptyDirVolumeSource::default()),
            1 => {
                v.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim,
                    read_only: None,
                })
            }
            2 => {
                v.host_path = Some(HostPathVolumeSource {
                    path: "/h".into(),
                    type_: None,
                })
            }
            3 => {
                v.config_map = Some(ConfigMapVolumeSource {
                    name: "cm".into(),
                    ..Default::default()
                })
            }
            4 => {
                v.csi = Some(CSIVolumeSource {
                    driver: "d".into(),
                    ..Default::default()
                })
            }
            5 => {
                v.image = Some(ImageVolumeSource {
                    reference: Some("r/i:1".into()),
                    pull_policy: None,
                })
            }
            _ => {}
        }
        v
    })
}

const IMAGES: &[&str] = &[
    "vllm/vllm-openai:v0.20.0",
    "nvcr.io/nim/meta/llama:1.8.3",
    "kserve/storage-initializer:v0.15",
    "amazon/aws-cli:2",
    "peakcom/s5cmd:v2",
    "python:3",
    "lmsysorg/sglang:latest",
    "x/nim/y@sha256:00",
    "",
];

fn container() -> impl Strategy<Value = Container> {
    (
        "[a-z]{1,6}",
        prop_oneof![
            prop::sample::select(IMAGES).prop_map(str::to_owned),
            ".{0,12}"
        ],
        proptest::option::of(prop_oneof![
            prop::collection::vec(arg(), 0..4),
            prop::sample::select(&["sh", "bash", "/bin/sh"][..])
                .prop_map(|sh| vec![sh.to_owned(), "-c".to_owned()]),
        ]),
        proptest::option::of(prop::collection::vec(arg(), 0..6)),
        prop::collection::vec(env_var(), 0..6),
        prop::collection::vec(mount(), 0..4),
        proptest::option::of(
            prop::sample::select(&["/", "/models", "rel", "/work"][..]).prop_map(str::to_owned),
        ),
        any::<bool>(),
    )
        .prop_map(
            |(name, image, command, args, env, mounts, working_dir, gpu)| Container {
                name,
                image: Some(image),
                command,
                args,
                env: Some(env),
                volume_mounts: Some(mounts),
                working_dir,
                resources: gpu.then(|| ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        "nvidia.com/gpu".to_owned(),
                        Quantity("1".into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (
        prop::collection::vec(container(), 0..3),
        prop::collection::vec(container(), 0..3),
        prop::collection::vec(volume(), 0..5),
    )
        .prop_map(|(init, containers, volumes)| PodSpec {
            init_containers: Some(init),
            containers,
            volumes: Some(volumes),
            ..Default::default()
        })
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        pod_spec(),
        proptest::option::of("[a-z0-9-]{1,10}"),
        proptest::option::of(prop::sample::select(&["0", "1", "2", ""][..])),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(spec, name, index, sts, opt_out)| {
            let mut labels = BTreeMap::new();
            if let Some(i) = index {
                labels.insert(LWS_NAME_LABEL.to_owned(), "group".to_owned());
                labels.insert(LWS_WORKER_INDEX_LABEL.to_owned(), i.to_owned());
            }
            Pod {
                metadata: ObjectMeta {
                    name,
                    labels: Some(labels),
                    annotations: opt_out.then(|| {
                        BTreeMap::from([(OPT_OUT_ANNOTATION.to_owned(), "true".to_owned())])
                    }),
                    owner_references: sts.then(|| {
                        vec![OwnerReference {
                            kind: "StatefulSet".into(),
                            name: "s".into(),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                },
                spec: Some(spec),
                status: None,
            }
        })
}

fn lws() -> impl Strategy<Value = LeaderWorkerSet> {
    (
        proptest::option::of(pod_spec()),
        pod_spec(),
        prop::sample::select(&["group", "other"][..]),
    )
        .prop_map(|(leader, worker, name)| LeaderWorkerSet {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: LeaderWorkerSetSpec {
                leader_worker_template: LeaderWorkerTemplate {
                    leader_template: leader.map(|s| PodTemplateSpec {
                        metadata: None,
                        spec: Some(s),
                    }),
                    worker_template: PodTemplateSpec {
                        metadata: None,
                        spec: Some(worker),
                    },
                },
            },
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(768))]

    #[test]
    fn resolution_never_panics_and_is_deterministic(p in pod()) {
        let a = resolve(&p);
        let b = resolve(&p);
        prop_assert_eq!(&a, &b);
        let report = a.report().unwrap();
        match &a {
            Outcome::Resolved(r) => {
                let uri = r.identity.uri();
                prop_assert_eq!(report["uri"].as_str(), Some(uri.as_str()));
                prop_assert!(r.landing.path.starts_with('/'), "landing {:?} is absolute", r.landing.path);
                prop_assert!(!r.landing.substitutable || (r.landing.kind.substitutable() && r.landing.nested.is_none()));
                // The identity the resolver produced round-trips.
                prop_assert_eq!(Identity::parse(&r.identity.uri()).unwrap(), r.identity.clone());
            }
            Outcome::Unresolved(u) => {
                prop_assert!(report["uri"].is_null());
                let reason = u.to_string();
                prop_assert_eq!(report["reason"].as_str(), Some(reason.as_str()));
            }
        }
    }

    #[test]
    fn group_resolution_never_panics_and_is_deterministic(p in pod(), g in proptest::option::of(lws())) {
        let a = resolve_with_group(&p, g.as_ref());
        let b = resolve_with_group(&p, g.as_ref());
        prop_assert_eq!(a, b);
    }

    #[test]
    fn pod_json_round_trip_resolves_the_same(p in pod()) {
        // What the webhook sees is JSON: resolving the decoded pod gives the same answer.
        let json = serde_json::to_string(&p).unwrap();
        let decoded: Pod = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(resolve(&decoded), resolve(&p));
    }
}

/// The generator reaches both answers and many rules, so the properties above are not vacuous.
#[test]
fn generated_pods_exercise_the_resolver() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = pod();
    let mut sources = std::collections::BTreeSet::new();
    let mut codes = std::collections::BTreeSet::new();
    for _ in 0..4000 {
        let p = strategy.new_tree(&mut runner).unwrap().current();
        match resolve(&p) {
            Outcome::Resolved(r) => {
                sources.insert(r.source.as_str());
            }
            Outcome::Unresolved(u) => {
                codes.insert(u.code());
            }
        }
    }
    assert!(sources.len() >= 8, "resolved sources reached: {sources:?}");
    assert!(codes.len() >= 6, "unresolved reasons reached: {codes:?}");
}

// ------------------------------------------------------------------------------------------------
// Bounds: pods built to blow up
// ------------------------------------------------------------------------------------------------

const BOMB_COMMANDS: &[&str] = &[
    "vllm serve $A",
    "vllm serve --model \"$A\"",
    "hf download $A --local-dir /models",
    "hf download org/m --local-dir \"$A\"",
    "export HF_HOME=\"$A\"; vllm serve org/m",
    "cd \"$A\"; hf download org/m --local-dir x",
    "sh -c \"$A\"",
    "aws s3 sync \"s3://b/$A\" /models",
    "HF_ENDPOINT=\"$A\" vllm serve org/m",
];

const SEEDS: &[&str] = &[
    "x",
    "Qwen/Qwen3-0.6B",
    "/m",
    " a b ",
    "true; ",
    "sh -c \"$A\"; ",
];

/// A container whose values grow far beyond its own size, or that repeats something many times.
fn bomb_container() -> impl Strategy<Value = Container> {
    (
        0..6u8,
        1..70usize,
        prop::sample::select(SEEDS),
        prop::sample::select(BOMB_COMMANDS),
        0..300_000usize,
    )
        .prop_map(|(kind, n, seed, cmd, len)| {
            let mut c = Container {
                name: "bomb".to_owned(),
                image: Some("python:3".to_owned()),
                ..Default::default()
            };
            let sh = |script: String| Some(vec!["sh".to_owned(), "-c".to_owned(), script]);
            let lit = |name: String, value: String| EnvVar {
                name,
                value: Some(value),
                value_from: None,
            };
            match kind {
                // A=$A$A, n times.
                0 => {
                    let mut script = format!("A='{seed}'\n");
                    for _ in 0..n {
                        script.push_str("A=\"$A$A\"\n");
                    }
                    script.push_str(cmd);
                    c.command = sh(script);
                }
                // V(k) = $(V(k-1))$(V(k-1)), n deep, used by the command.
                1 => {
                    let mut env = vec![lit("V0".to_owned(), seed.to_owned())];
                    for k in 1..=n {
                        env.push(lit(format!("V{k}"), format!("$(V{})$(V{})", k - 1, k - 1)));
                    }
                    env.push(lit("A".to_owned(), format!("$(V{n})")));
                    c.env = Some(env);
                    c.command = sh(cmd.to_owned());
                }
                // A huge literal value.
                2 => {
                    c.env = Some(vec![lit("A".to_owned(), seed.repeat(len / seed.len() + 1))]);
                    c.command = sh(cmd.to_owned());
                }
                // Many exports (and commands) in one script.
                3 => {
                    let mut script = String::new();
                    for i in 0..n * 60 {
                        script.push_str(&format!("export V{i}={seed:?}; true; "));
                    }
                    script.push_str("A=x; ");
                    script.push_str(cmd);
                    c.command = sh(script);
                }
                // Nested shells, n deep.
                4 => {
                    let mut script = cmd.replace("$A", "org/m");
                    for _ in 0..n.min(12) {
                        script = format!("sh -c '{}'", script.replace('\'', "'\\''"));
                    }
                    c.command = sh(script);
                }
                // An argument referencing a variable n times, and a huge literal argument.
                _ => {
                    c.env = Some(vec![lit("A".to_owned(), seed.repeat(len / 64 + 1))]);
                    c.command = Some(vec![
                        "vllm".to_owned(),
                        "serve".to_owned(),
                        "$(A)".repeat(n),
                        "--revision".to_owned(),
                        seed.repeat(len / seed.len() + 1),
                    ]);
                }
            }
            c
        })
}

fn bomb_pod() -> impl Strategy<Value = Pod> {
    (
        prop::collection::vec(prop_oneof![container(), bomb_container()], 0..3),
        prop::collection::vec(prop_oneof![container(), bomb_container()], 1..3),
        prop::collection::vec(volume(), 0..3),
    )
        .prop_map(|(init, containers, volumes)| Pod {
            spec: Some(PodSpec {
                init_containers: Some(init),
                containers,
                volumes: Some(volumes),
                ..Default::default()
            }),
            ..Default::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn report_size_is_bounded_by_the_pod(p in bomb_pod()) {
        let input = serde_json::to_string(&p).unwrap();
        let (outcome, expanded, commands) = debug_resolve_cost(&p);
        prop_assert!(expanded <= MAX_EXPANSION_BYTES, "expanded {expanded} bytes");
        prop_assert!(commands <= MAX_COMMANDS, "read {commands} commands");
        prop_assert_eq!(&outcome, &resolve(&p));
        let report = outcome.report_json().unwrap();
        prop_assert!(
            report.len() <= 4 * input.len() + 16 * 1024,
            "report of {} bytes for a pod of {} bytes",
            report.len(),
            input.len()
        );
        if let Outcome::Unresolved(u) = &outcome {
            prop_assert!(u.to_string().len() <= warmcache_modelid::MAX_REASON_BYTES + 32);
        }
    }
}
