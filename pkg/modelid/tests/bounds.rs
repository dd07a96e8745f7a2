//! Deterministic cases for the resolver's bounds: landings through empty or relative mount paths
//! (shrunk property-test failures), and inputs of a few hundred bytes that expand without bound
//! (doubling scripts, `$(V)` chains, deep nesting, thousands of exports) or that echo a huge value
//! into a reason. Each must resolve to a bounded answer that says which bound was hit; none may
//! allocate in proportion to the expansion it describes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, Volume, VolumeMount,
};
use warmcache_modelid::{
    MAX_COMMANDS, MAX_EXPANSION_BYTES, Outcome, Unresolved, debug_resolve_cost, resolve,
};

fn container(name: &str, command: &[&str], env: &[(&str, &str)]) -> Container {
    Container {
        name: name.to_owned(),
        image: Some("python:3".to_owned()),
        command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
        env: Some(
            env.iter()
                .map(|(n, v)| EnvVar {
                    name: (*n).to_owned(),
                    value: Some((*v).to_owned()),
                    value_from: None,
                })
                .collect(),
        ),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, sub_path: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        sub_path: sub_path.map(str::to_owned),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

fn pod(inits: Vec<Container>, main: Container, volumes: Vec<Volume>) -> Pod {
    Pod {
        spec: Some(PodSpec {
            init_containers: Some(inits),
            containers: vec![main],
            volumes: Some(volumes),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn unresolved(o: &Outcome) -> &Unresolved {
    match o {
        Outcome::Unresolved(u) => u,
        Outcome::Resolved(r) => panic!("expected unresolved, got {r:?}"),
    }
}

/// The report JSON, checked to be small.
fn small_report(o: &Outcome, max: usize) -> String {
    let json = o.report_json().unwrap();
    assert!(
        json.len() <= max,
        "report is {} bytes (at most {max} expected): {}...",
        json.len(),
        json.chars().take(300).collect::<String>()
    );
    json
}

/// An init that downloads into `/models` (emptyDir `m`, subPath `models`).
fn hf_init(local_dir: &str) -> Container {
    let mut init = container(
        "fetch",
        &[
            "hf",
            "download",
            "Qwen/Qwen3-0.6B",
            "--local-dir",
            local_dir,
        ],
        &[],
    );
    init.volume_mounts = Some(vec![mount("m", "/models", Some("models"))]);
    init
}

fn vllm_main(mounts: Vec<VolumeMount>) -> Container {
    let mut main = container("engine", &["vllm", "serve", "/data/q"], &[]);
    main.volume_mounts = Some(mounts);
    main
}

// ------------------------------------------------------------------------------------------------
// Landings through empty or relative mount paths (shrunk from `properties.rs` failures)
// ------------------------------------------------------------------------------------------------

#[test]
fn empty_mount_path_with_sub_path_is_no_landing() {
    // The init writes /models (= volume m, subPath models); the main container mounts that part
    // at "": the landing was "." before, which is not a place in any container.
    for local_dir in ["/models", "/models/q"] {
        let p = pod(
            vec![hf_init(local_dir)],
            vllm_main(vec![mount("m", "", Some("models"))]),
            vec![empty_dir("m")],
        );
        let o = resolve(&p);
        let u = unresolved(&o);
        assert_eq!(u.code(), "landing-unknown", "{local_dir}: {u}");
        assert!(
            u.to_string()
                .starts_with("spec.containers[0].volumeMounts[0].mountPath: "),
            "{u}"
        );
    }
}

#[test]
fn relative_mount_path_is_no_landing() {
    let p = pod(
        vec![hf_init("/models")],
        vllm_main(vec![mount("m", "data", Some("models"))]),
        vec![empty_dir("m")],
    );
    let u = resolve(&p);
    let u = unresolved(&u);
    assert_eq!(u.code(), "landing-unknown", "{u}");
    assert!(
        u.to_string().contains("\"data\" is not an absolute path"),
        "{u}"
    );
}

#[test]
fn relative_mount_path_of_the_downloading_init_is_no_landing() {
    // `hf download` without a destination writes to the init's mount root: its only mount is
    // relative, so the mount root was "rel".
    let mut init = container("fetch", &["hf", "download", "Qwen/Qwen3-0.6B"], &[]);
    init.volume_mounts = Some(vec![mount("m", "rel", None)]);
    let p = pod(
        vec![init],
        vllm_main(vec![mount("m", "/data", None)]),
        vec![empty_dir("m")],
    );
    let o = resolve(&p);
    let u = unresolved(&o);
    assert_eq!(u.code(), "landing-unknown", "{u}");
    assert!(
        u.to_string()
            .starts_with("spec.initContainers[0].volumeMounts[0].mountPath: "),
        "{u}"
    );
}

#[test]
fn relative_mount_path_of_the_engine_is_no_landing() {
    // A relative mount is placed by the runtime, if at all; the engine cache may be under it.
    let mut main = container(
        "engine",
        &["vllm", "serve", "Qwen/Qwen3-0.6B"],
        &[("HF_HOME", "/models")],
    );
    main.volume_mounts = Some(vec![mount("m", "models", None)]);
    let o = resolve(&pod(Vec::new(), main, vec![empty_dir("m")]));
    assert_eq!(unresolved(&o).code(), "landing-unknown");
}

#[test]
fn absolute_mounts_still_land_through_the_volume() {
    let p = pod(
        vec![hf_init("/models/q")],
        vllm_main(vec![mount("m", "/data", Some("models"))]),
        vec![empty_dir("m")],
    );
    let Outcome::Resolved(r) = resolve(&p) else {
        panic!("resolves");
    };
    assert_eq!(r.landing.path, "/data/q");
}

// ------------------------------------------------------------------------------------------------
// Expansion bombs
// ------------------------------------------------------------------------------------------------

/// Resolve, checking the work done (bytes inserted by expansions, commands read) against the
/// bounds: a structural measure of time and memory, not a timing.
fn metered(p: &Pod) -> Outcome {
    let (o, expanded, commands) = debug_resolve_cost(p);
    assert!(expanded <= MAX_EXPANSION_BYTES, "expanded {expanded} bytes");
    assert!(commands <= MAX_COMMANDS, "read {commands} commands");
    assert_eq!(o, resolve(p), "the metered resolution is the resolution");
    o
}

/// The reason of an outcome that hit a bound: unknown value, naming the bound.
fn bound_hit(o: &Outcome, field: &str, bound: &str) {
    let u = unresolved(o);
    let reason = u.to_string();
    assert_eq!(u.code(), "unknown-value", "{reason}");
    assert!(reason.starts_with(field), "{reason}");
    assert!(reason.contains(bound), "{reason}");
    assert!(reason.contains("left alone"), "{reason}");
}

#[test]
fn doubling_script_is_bounded() {
    // 64 doublings of one byte: 2^64 bytes if expanded.
    let mut script = String::from("A=x\n");
    for _ in 0..64 {
        script.push_str("A=$A$A\n");
    }
    script.push_str("exec vllm serve \"$A\"\n");
    assert!(script.len() < 600);
    let main = container("engine", &["sh", "-c", &script], &[]);
    let o = metered(&pod(Vec::new(), main, Vec::new()));
    bound_hit(&o, "spec.containers[0].command: ", "MAX_VALUE_BYTES");
    small_report(&o, 1024);
}

#[test]
fn doubling_script_in_an_init_container_is_bounded() {
    let mut script = String::from("R=Qwen/Qwen3-0.6B; ");
    for _ in 0..64 {
        script.push_str("R=\"$R $R\"; ");
    }
    script.push_str("hf download $R --local-dir /models");
    let init = container("fetch", &["bash", "-lc", &script], &[]);
    let main = container("engine", &["vllm", "serve", "/models"], &[]);
    let o = metered(&pod(vec![init], main, Vec::new()));
    bound_hit(&o, "spec.initContainers[0].command: ", "MAX_VALUE_BYTES");
}

#[test]
fn doubling_env_chain_is_bounded() {
    // V0 = "xx", Vk = $(V(k-1))$(V(k-1)): V40 would be 2^41 bytes.
    let names: Vec<String> = (0..=40).map(|k| format!("V{k}")).collect();
    let values: Vec<String> = (0..=40)
        .map(|k| {
            if k == 0 {
                "xx".to_owned()
            } else {
                format!("$(V{})$(V{})", k - 1, k - 1)
            }
        })
        .collect();
    let env: Vec<(&str, &str)> = names
        .iter()
        .zip(&values)
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let main = container("engine", &["vllm", "serve", "--model", "$(V40)"], &env);
    let o = metered(&pod(Vec::new(), main, Vec::new()));
    bound_hit(&o, "spec.containers[0].env[", "MAX_VALUE_BYTES");
    small_report(&o, 1024);
}

#[test]
fn doubling_args_reference_is_bounded() {
    // Each arg references a 512 KiB literal twice: the pod is small next to its expansion.
    let big = "a".repeat(512 * 1024);
    let refs = "$(BIG)".repeat(64);
    let main = container("engine", &["vllm", "serve", &refs], &[("BIG", &big)]);
    let o = metered(&pod(Vec::new(), main, Vec::new()));
    bound_hit(&o, "spec.containers[0].command: ", "MAX_VALUE_BYTES");
}

#[test]
fn expansion_budget_is_per_pod() {
    // Sixteen init containers, each expanding a 512 KiB value to 1 MiB: 16 MiB in all.
    let big = "b".repeat(512 * 1024);
    let inits: Vec<Container> = (0..16)
        .map(|i| {
            container(
                &format!("i{i}"),
                &["sh", "-c", "echo \"$BIG$BIG\" > /dev/null"],
                &[("BIG", &big)],
            )
        })
        .collect();
    let main = container("engine", &["vllm", "serve", "Qwen/Qwen3-0.6B"], &[]);
    let o = metered(&pod(inits, main, Vec::new()));
    bound_hit(&o, "spec.initContainers[", "MAX_EXPANSION_BYTES");
}

#[test]
fn one_megabyte_argument_is_not_echoed() {
    let value = "!".repeat(1 << 20);
    let main = container("engine", &["vllm", "serve", "--model", &value], &[]);
    let o = metered(&pod(Vec::new(), main, Vec::new()));
    let u = unresolved(&o);
    assert_eq!(u.code(), "invalid-reference");
    let reason = u.to_string();
    assert!(reason.len() < 1024, "{} bytes", reason.len());
    assert!(reason.contains("(1048576 bytes in all)"), "{reason}");
    small_report(&o, 1024);
}

#[test]
fn one_megabyte_values_are_not_echoed_anywhere() {
    // Just below MAX_VALUE_BYTES, so that every value is read and reaches a reason.
    let huge = "h".repeat((1 << 20) - 64);
    let url = format!("https://{huge}");
    let mut pods = Vec::new();
    // An unsupported source, a custom endpoint, a value from a script, an unknown revision.
    for (command, env) in [
        (vec!["vllm", "serve", url.as_str()], vec![]),
        (
            vec!["vllm", "serve", "Qwen/Qwen3-0.6B"],
            vec![("HF_ENDPOINT", url.as_str())],
        ),
        (
            vec!["sh", "-c", "vllm serve --model \"$X\""],
            vec![("X", url.as_str())],
        ),
        (
            vec![
                "sh",
                "-c",
                "vllm serve Qwen/Qwen3-0.6B --revision \"$X$(id)\"",
            ],
            vec![("X", huge.as_str())],
        ),
    ] {
        pods.push(pod(
            Vec::new(),
            container("engine", &command, &env),
            Vec::new(),
        ));
    }
    // Two inits copying different huge keys.
    let key_a = format!("s3://bucket/{huge}a");
    let key_b = format!("s3://bucket/{huge}b");
    pods.push(pod(
        vec![
            container("a", &["aws", "s3", "sync", &key_a, "/models"], &[]),
            container("b", &["aws", "s3", "sync", &key_b, "/models"], &[]),
        ],
        container("engine", &["vllm", "serve", "/models"], &[]),
        Vec::new(),
    ));
    for p in &pods {
        let o = resolve(p);
        let json = small_report(&o, 2048);
        assert!(json.contains("bytes in all"), "{json}");
    }
    // A volume with a huge name mounted below the landing: the report names the volume (as
    // the pod does), but the reason in `landing.nested` quotes it cut.
    let mut main = container("engine", &["vllm", "serve", "Qwen/Qwen3-0.6B"], &[]);
    main.volume_mounts = Some(vec![mount(&huge, "/root/.cache/huggingface/hub", None)]);
    let Outcome::Resolved(r) = resolve(&pod(Vec::new(), main, vec![empty_dir(&huge)])) else {
        panic!("resolves");
    };
    let nested = r.landing.nested.unwrap();
    assert!(nested.len() < 512, "{nested}");
    assert!(nested.contains("bytes in all"), "{nested}");
}

#[test]
fn thousands_of_exports_are_bounded() {
    let mut script = String::new();
    for i in 0..5000 {
        script.push_str(&format!("export V{i}=x; true; "));
    }
    script.push_str("hf download Qwen/Qwen3-0.6B --local-dir /models");
    let init = container("fetch", &["sh", "-c", &script], &[]);
    let main = container("engine", &["vllm", "serve", "/models"], &[]);
    let o = metered(&pod(vec![init], main, Vec::new()));
    bound_hit(&o, "spec.initContainers[0].command: ", "MAX_EXPORTS");
}

#[test]
fn a_few_exports_still_reach_the_command() {
    let mut script = String::new();
    for i in 0..50 {
        script.push_str(&format!("export V{i}=x; true; "));
    }
    script.push_str("export HF_HOME=/models/hf; hf download Qwen/Qwen3-0.6B");
    let mut init = container("fetch", &["sh", "-c", &script], &[]);
    init.volume_mounts = Some(vec![mount("m", "/models", None)]);
    let main = vllm_main(vec![mount("m", "/models", None)]);
    let Outcome::Resolved(r) = resolve(&pod(vec![init], main, vec![empty_dir("m")])) else {
        panic!("resolves");
    };
    assert_eq!(r.landing.path, "/models/hf");
}

#[test]
fn deep_shell_nesting_is_bounded() {
    // Nine shells deep, an init downloads; nothing may be concluded from the outer levels.
    let mut script = "hf download Qwen/Qwen3-0.6B --local-dir /models".to_owned();
    for _ in 0..8 {
        script = format!("sh -c {}", shell_quote(&script));
    }
    let init = container("fetch", &["sh", "-c", &script], &[]);
    let main = container("engine", &["vllm", "serve", "org/other"], &[]);
    let o = metered(&pod(vec![init], main, Vec::new()));
    bound_hit(&o, "spec.initContainers[0].command: ", "MAX_SHELL_DEPTH");
}

#[test]
fn nested_fan_out_is_bounded() {
    // Each level runs the next one 64 times: 64^4 commands if followed.
    let script = "L1='sh -c \"$L2\"; '; L2='sh -c \"$L3\"; '; L3='true; '; \
                  L3=\"$L3$L3$L3$L3$L3$L3$L3$L3\"; L3=\"$L3$L3$L3$L3$L3$L3$L3$L3\"; \
                  L2=\"$L2$L2$L2$L2$L2$L2$L2$L2\"; L2=\"$L2$L2$L2$L2$L2$L2$L2$L2\"; \
                  export L2 L3; \
                  sh -c \"$L2\"; sh -c \"$L2\"; sh -c \"$L2\"; sh -c \"$L2\"; \
                  sh -c \"$L2\"; sh -c \"$L2\"; sh -c \"$L2\"; sh -c \"$L2\"; \
                  hf download Qwen/Qwen3-0.6B --local-dir /models";
    let init = container("fetch", &["sh", "-c", script], &[]);
    let main = container("engine", &["vllm", "serve", "/models"], &[]);
    let o = metered(&pod(vec![init], main, Vec::new()));
    bound_hit(&o, "spec.initContainers[0].command: ", "MAX_COMMANDS");
}

#[test]
fn growing_working_directory_is_bounded() {
    // `cd a` repeated: a working directory that grows with every command.
    let script = format!(
        "cd /w; {}hf download Qwen/Qwen3-0.6B --local-dir m",
        "cd a; ".repeat(60_000)
    );
    let init = container("fetch", &["sh", "-c", &script], &[]);
    let main = container("engine", &["vllm", "serve", "/models"], &[]);
    let o = metered(&pod(vec![init], main, Vec::new()));
    bound_hit(
        &o,
        "spec.initContainers[0].command: ",
        "MAX_EXPANSION_BYTES",
    );
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
