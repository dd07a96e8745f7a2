//! The checks that keep a rewrite from breaking a pod it does not fully understand: a landing
//! that something else writes, and engines that fetch more than the one artifact the cache holds.

use k8s_openapi::api::core::v1::Container;
use warmcache_cli::text::shown;
use warmcache_modelid::paths::{clean, is_within};
use warmcache_modelid::{Identity, Scheme};

use crate::words::{
    EnvValue, container_words, env_value, flag_lists, flag_values, literal_env, script_assignments,
};

/// Directories other programs write to (temporary files, homes, runtime state, the system
/// itself). A read-only copy mounted at one of them, or at a directory above one, would take it
/// from every other writer: `HF_HOME=/tmp` next to `PROMETHEUS_MULTIPROC_DIR=/tmp`.
const SHARED_DIRS: [&str; 22] = [
    "/",
    "/tmp",
    "/var/tmp",
    "/dev",
    "/dev/shm",
    "/run",
    "/var",
    "/var/run",
    "/var/log",
    "/var/lib",
    "/proc",
    "/sys",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/home",
    "/root",
    "/root/.cache",
    "/opt",
];

/// Variables that say where the model is read from: a landing they point at is the model's.
pub(crate) const MODEL_VARIABLES: [&str; 19] = [
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_MODEL_ID",
    "MODEL_ID",
    "MODEL_PATH",
    "MODEL_DIR",
    "MODEL_NAME",
    "MODEL",
    "NGC_MODEL_MOUNT",
    "NGC_STABLE_MODEL_PATH",
    "NGC_MODEL_NAME",
    "NIM_CACHE_PATH",
    "NIM_MODEL_NAME",
    "NIM_MODEL_PROFILE",
    "STORAGE_URI",
];

/// Search-path variables: directories read, not written.
const READ_PATH_VARIABLES: [&str; 8] = [
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "LIBRARY_PATH",
    "CPATH",
    "MANPATH",
    "CUDA_HOME",
    "CUDA_PATH",
];

fn is_variable_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why `landing` (clean, absolute, in `main`'s view) is written by something other than the
/// model download, if it is: it is (or is above) a directory other programs write, the
/// container's home, cache home or working directory, or a variable of `main` other than the
/// model's own points at or below it.
pub(crate) fn landing_shared(main: &Container, main_path: &str, landing: &str) -> Option<String> {
    let landing = clean(landing);
    if let Some(dir) = SHARED_DIRS.iter().find(|d| is_within(d, &landing)) {
        return Some(if *dir == landing {
            format!(
                "{main_path}: the landing {} is a directory other programs write to",
                shown(&landing)
            )
        } else {
            format!(
                "{main_path}: the landing {} lies above {}, a directory other programs write to",
                shown(&landing),
                shown(dir)
            )
        });
    }
    let parts: Vec<&str> = landing.trim_start_matches('/').split('/').collect();
    if parts.first() == Some(&"home")
        && (parts.len() == 2 || (parts.len() == 3 && parts[2] == ".cache"))
    {
        return Some(format!(
            "{main_path}: the landing {} is a home or cache directory other programs write to",
            shown(&landing)
        ));
    }
    let mut homes: Vec<(String, String)> = Vec::new();
    if let Some(EnvValue::Literal(h)) = env_value(main, "HOME") {
        homes.push((format!("{main_path}.env[HOME]"), clean(&h)));
        homes.push((
            format!("{main_path}.env[HOME]"),
            clean(&format!("{h}/.cache")),
        ));
    }
    if let Some(EnvValue::Literal(x)) = env_value(main, "XDG_CACHE_HOME") {
        homes.push((format!("{main_path}.env[XDG_CACHE_HOME]"), clean(&x)));
    }
    if let Some(w) = &main.working_dir {
        homes.push((format!("{main_path}.workingDir"), clean(w)));
    }
    for (field, dir) in homes {
        if dir.starts_with('/') && is_within(&dir, &landing) {
            return Some(format!(
                "{field}: {} lies at or below the landing {}, so the container writes there",
                shown(&dir),
                shown(&landing)
            ));
        }
    }
    let mut vars: Vec<(String, String, String)> = literal_env(main)
        .into_iter()
        .map(|(n, v)| (format!("{main_path}.env[{n}]"), n, v))
        .collect();
    let script: Vec<(String, String, String)> = container_words(main)
        .into_iter()
        .filter_map(|w| {
            let (n, v) = w.split_once('=')?;
            is_variable_name(n)
                .then(|| (format!("{main_path}.command"), n.to_owned(), v.to_owned()))
        })
        .collect();
    vars.extend(script);
    for (field, name, value) in vars {
        if MODEL_VARIABLES.contains(&name.as_str()) || READ_PATH_VARIABLES.contains(&name.as_str())
        {
            continue;
        }
        let v = value.trim();
        if !v.starts_with('/') {
            continue;
        }
        let dir = clean(v);
        if is_within(&dir, &landing) {
            return Some(format!(
                "{field}: {name}={} lies at or below the landing {}, so the container writes there",
                shown(v),
                shown(&landing)
            ));
        }
    }
    None
}

/// Single-value options that name something an engine fetches besides its model (vLLM,
/// SGLang, TGI and KServe spellings).
const EXTRA_MODEL_FLAGS: [&str; 12] = [
    "--tokenizer",
    "--tokenizer-path",
    "--tokenizer_path",
    "--speculative-model",
    "--speculative_model",
    "--draft-model",
    "--speculative-draft-model-path",
    "--speculative-draft",
    "--hf-config-path",
    "--qlora-adapter-name-or-path",
    "--tokenizer-config-path",
    "--tokenizer_config_path",
];

/// Options naming another revision of the model's own repository.
const EXTRA_REVISION_FLAGS: [&str; 4] = [
    "--tokenizer-revision",
    "--tokenizer_revision",
    "--code-revision",
    "--speculative-model-revision",
];

/// List options of adapters.
const ADAPTER_LIST_FLAGS: [&str; 4] = [
    "--lora-modules",
    "--lora-paths",
    "--lora-adapters",
    "--lora_modules",
];

/// Speculative methods that need no draft model of their own.
const SELF_SPECULATION: [&str; 6] = [
    "ngram",
    "[ngram]",
    "mtp",
    "deepseek_mtp",
    "medusa",
    "mlp_speculator",
];

/// Whether reference `v` is something the cache holds or the pod has already: the model
/// itself, or a local path.
fn is_covered(v: &str, identity: &Identity) -> bool {
    let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
    if v.is_empty() || v.contains('$') {
        return false;
    }
    if v.starts_with('/') || v.starts_with("./") || v.starts_with("../") || v == "." {
        return true;
    }
    if identity.scheme() == Scheme::Hf {
        let repo = v.strip_prefix("hf://").unwrap_or(v);
        let repo = repo.split_once('@').map_or(repo, |(r, _)| r);
        return repo == identity.reference();
    }
    false
}

fn same_revision(v: &str, identity: &Identity) -> bool {
    let v = v.trim();
    match identity.revision() {
        Some(r) => r == v,
        None => v == "main",
    }
}

/// What `main` fetches at start besides `identity`: each entry names the option or variable and
/// the value. Any value that is not the model itself or a local path counts (another
/// repository, another revision, a value not known at admission).
pub(crate) fn extra_repositories(
    main: &Container,
    main_path: &str,
    identity: &Identity,
) -> Vec<String> {
    let words = container_words(main);
    let mut out = Vec::new();
    let mut note = |what: String| out.push(format!("{main_path}: {what}"));
    for flag in EXTRA_MODEL_FLAGS {
        for v in flag_values(&words, &[flag]) {
            match v {
                Some(v) if is_covered(&v, identity) => {}
                Some(v)
                    if flag.starts_with("--speculative")
                        && SELF_SPECULATION.contains(&v.to_ascii_lowercase().as_str()) => {}
                Some(v) => note(format!("{flag} {}", shown(&v))),
                None => note(format!("{flag} without a value")),
            }
        }
    }
    for flag in EXTRA_REVISION_FLAGS {
        for v in flag_values(&words, &[flag]).into_iter().flatten() {
            if !same_revision(&v, identity) {
                note(format!("{flag} {} (another revision)", shown(&v)));
            }
        }
    }
    for v in flag_values(&words, &["--speculative-config", "--speculative_config"]) {
        let Some(v) = v else {
            note("--speculative-config without a value".to_owned());
            continue;
        };
        match serde_json::from_str::<serde_json::Value>(&v) {
            Ok(serde_json::Value::Object(m)) => match m.get("model") {
                None | Some(serde_json::Value::Null) => {}
                Some(serde_json::Value::String(model)) if is_covered(model, identity) => {}
                Some(serde_json::Value::String(model)) => {
                    note(format!("--speculative-config draft model {}", shown(model)));
                }
                Some(other) => note(format!(
                    "--speculative-config model {}",
                    shown(&other.to_string())
                )),
            },
            _ => note(format!(
                "--speculative-config {} (not read as JSON)",
                shown(&v)
            )),
        }
    }
    let mut adapters: Vec<String> = flag_lists(&words, &ADAPTER_LIST_FLAGS)
        .into_iter()
        .flatten()
        .flat_map(|v| v.split(',').map(str::to_owned).collect::<Vec<_>>())
        .collect();
    match env_value(main, "LORA_ADAPTERS") {
        Some(EnvValue::Literal(v)) => adapters.extend(v.split(',').map(str::to_owned)),
        Some(EnvValue::Unknown) => note("env LORA_ADAPTERS is not set literally".to_owned()),
        None => {}
    }
    for (_, v) in script_assignments(main, &["LORA_ADAPTERS"]) {
        adapters.extend(v.split(',').map(str::to_owned));
    }
    for a in adapters.iter().map(|a| a.trim()).filter(|a| !a.is_empty()) {
        let path = if a.starts_with('{') {
            serde_json::from_str::<serde_json::Value>(a)
                .ok()
                .and_then(|j| j.get("path").and_then(|p| p.as_str().map(str::to_owned)))
                .unwrap_or_default()
        } else {
            a.split_once('=').map_or(a, |(_, p)| p).to_owned()
        };
        if !is_covered(&path, identity) {
            note(format!("adapter {}", shown(a)));
        }
    }
    let runtime_lora = match env_value(main, "VLLM_ALLOW_RUNTIME_LORA_UPDATING") {
        Some(EnvValue::Literal(v)) => {
            matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true")
        }
        Some(EnvValue::Unknown) => true,
        None => false,
    };
    if runtime_lora {
        note("VLLM_ALLOW_RUNTIME_LORA_UPDATING loads adapters from the Hub at run time".to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::EnvVar;

    fn c(args: &[&str], env: &[(&str, &str)]) -> Container {
        Container {
            name: "vllm".into(),
            args: Some(args.iter().map(|s| (*s).to_owned()).collect()),
            env: Some(
                env.iter()
                    .map(|(n, v)| EnvVar {
                        name: (*n).to_owned(),
                        value: Some((*v).to_owned()),
                        value_from: None,
                    })
                    .collect(),
            ),
            ..Container::default()
        }
    }

    fn qwen() -> Identity {
        Identity::hf("Qwen/Qwen3-8B", None).unwrap()
    }

    #[test]
    fn shared_landings() {
        let p = "spec.containers[0]";
        assert!(landing_shared(&c(&[], &[]), p, "/tmp").is_some());
        assert!(landing_shared(&c(&[], &[]), p, "/").is_some());
        assert!(landing_shared(&c(&[], &[]), p, "/home/user").is_some());
        assert!(landing_shared(&c(&[], &[]), p, "/root/.cache").is_some());
        assert!(landing_shared(&c(&[], &[]), p, "/models").is_none());
        assert!(landing_shared(&c(&[], &[]), p, "/root/.cache/huggingface").is_none());
        assert!(landing_shared(&c(&[], &[]), p, "/tmp/hf").is_none());
        let prom = c(
            &[],
            &[
                ("HF_HOME", "/data"),
                ("PROMETHEUS_MULTIPROC_DIR", "/data/prom"),
            ],
        );
        let why = landing_shared(&prom, p, "/data").unwrap();
        assert!(why.contains("PROMETHEUS_MULTIPROC_DIR"), "{why}");
        let home = c(&[], &[("HOME", "/data")]);
        assert!(landing_shared(&home, p, "/data").is_some());
        let script = c(
            &[
                "sh",
                "-c",
                "export TRITON_CACHE_DIR=/data/triton; vllm serve x",
            ],
            &[],
        );
        assert!(landing_shared(&script, p, "/data").is_some());
        let model_vars = c(
            &[],
            &[
                ("HF_HOME", "/data"),
                ("MODEL_PATH", "/data/x"),
                ("PATH", "/data/bin"),
            ],
        );
        assert!(landing_shared(&model_vars, p, "/data").is_none());
    }

    #[test]
    fn extra_repositories_are_found() {
        let p = "spec.containers[0]";
        let none = extra_repositories(
            &c(
                &["--model", "Qwen/Qwen3-8B", "--tokenizer", "Qwen/Qwen3-8B"],
                &[],
            ),
            p,
            &qwen(),
        );
        assert!(none.is_empty(), "{none:?}");
        let tok = extra_repositories(
            &c(
                &["--model", "Qwen/Qwen3-8B", "--tokenizer", "other/tok"],
                &[],
            ),
            p,
            &qwen(),
        );
        assert_eq!(tok.len(), 1, "{tok:?}");
        let spec = extra_repositories(
            &c(
                &[
                    "--speculative-config",
                    r#"{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 5}"#,
                ],
                &[],
            ),
            p,
            &qwen(),
        );
        assert_eq!(spec.len(), 1, "{spec:?}");
        let ngram = extra_repositories(
            &c(
                &[
                    "--speculative-config",
                    r#"{"method": "ngram", "num_speculative_tokens": 5}"#,
                ],
                &[],
            ),
            p,
            &qwen(),
        );
        assert!(ngram.is_empty(), "{ngram:?}");
        let lora = extra_repositories(
            &c(
                &[
                    "--enable-lora",
                    "--lora-modules",
                    "sql=/adapters/sql",
                    "chat=org/chat-lora",
                ],
                &[],
            ),
            p,
            &qwen(),
        );
        assert_eq!(lora.len(), 1, "{lora:?}");
        let rev = extra_repositories(&c(&["--tokenizer-revision", "v2"], &[]), p, &qwen());
        assert_eq!(rev.len(), 1, "{rev:?}");
        let main_rev = extra_repositories(&c(&["--tokenizer-revision", "main"], &[]), p, &qwen());
        assert!(main_rev.is_empty());
        let tgi = extra_repositories(
            &c(&[], &[("LORA_ADAPTERS", "predibase/a,predibase/b")]),
            p,
            &qwen(),
        );
        assert_eq!(tgi.len(), 2, "{tgi:?}");
        let runtime = extra_repositories(
            &c(&[], &[("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")]),
            p,
            &qwen(),
        );
        assert_eq!(runtime.len(), 1);
        let unknown = extra_repositories(
            &c(
                &["sh", "-c", "vllm serve Qwen/Qwen3-8B --tokenizer $TOK"],
                &[],
            ),
            p,
            &qwen(),
        );
        assert_eq!(unknown.len(), 1, "{unknown:?}");
    }
}
