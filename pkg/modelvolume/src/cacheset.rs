//! Compile-cache sets: what an engine compiles at start (torch.compile's Inductor artifacts,
//! Triton kernels, vLLM's compile cache, CUDA's JIT cache, FlashInfer and DeepGEMM kernels, the
//! transformers modules cache), collected once per configuration and rank from the first pod
//! that turned Ready, and seeded into the local cache directory of every later pod of the same
//! configuration and rank.
//!
//! - **Where the caches go.** Each compile-cache variable the engine does not set itself points
//!   into the pod's scratch emptyDir ([`crate::keys::SCRATCH_PATH`]) at a fixed place
//!   ([`COMPILE_CACHE_VARIABLES`]), so one directory holds everything a set carries. Caches stay
//!   local and writable on every storage: the model copy is read-only.
//! - **Which set.** A set is keyed by the configuration that decides what gets compiled: the
//!   model's cache handle (identity, layout, endpoints, the `nvsnap.io/cache-salt` salt, a
//!   refresh window), the engine image, the main container's command line without the words that
//!   wire one pod to its group (addresses, ranks), its environment without the variables a
//!   LeaderWorkerSet sets per group, the GPUs it asks for and the GPU product its node selector
//!   names, and the **rank**: the LeaderWorkerSet worker index (`0` outside a group).
//!   [`cache_set_handle`] writes it as `cache://<sha256 of the configuration>?rank=<rank>`, the
//!   cache handle of the set's own binding.
//! - **What never travels.** A set holds only the compile-cache directories; within them,
//!   [`travels`] refuses any path that names a credential (NGC CLI config, Hugging Face tokens,
//!   cloud and registry credentials, keys), so a token an engine left in its cache stays in its pod.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;
use warmcache_api_modelcache::v2beta1::BindingIdentity;
use warmcache_api_modelcache::{binding_name, identity_hash, sha256_digest};
use warmcache_modelid::LWS_WORKER_INDEX_LABEL;

use crate::binding::BindingTarget;
use crate::handle::CacheHandle;
use crate::keys::{CACHE_CAPTURE_LABEL, CACHE_KEY_LABEL, SCRATCH_PATH, SEED_CONTAINER};
use crate::plan::Plan;
use crate::scope::SharingDomain;
use crate::words::container_words;

/// The compile-cache variables and where each points inside the scratch directory, as nvsnap's
/// cache environment template laid them out (`TRITON_CACHE_DIR={cache}/.triton/cache`, ...).
pub const COMPILE_CACHE_VARIABLES: [(&str, &str); 6] = [
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("TRITON_CACHE_DIR", ".triton/cache"),
    ("VLLM_CACHE_ROOT", ".cache/vllm"),
    ("CUDA_CACHE_PATH", ".nv/ComputeCache"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("DG_JIT_CACHE_DIR", ".deep_gemm"),
];

/// The directory of the transformers modules cache inside the scratch directory
/// (`HF_MODULES_CACHE`, set by the model rewrite when `HF_HOME` is the read-only copy).
pub const MODULES_CACHE_DIR: &str = "hf_modules";

/// Prefixes of environment variables a LeaderWorkerSet sets per group or per pod (the leader's
/// address, the group index): they wire a pod to its group and do not change what is compiled.
const WIRING_ENV_PREFIXES: [&str; 1] = ["LWS_"];

/// Command-line flags that wire a pod to its group (addresses, ports of the group, ranks): the
/// flag and its value are left out of the configuration.
const WIRING_FLAGS: [&str; 12] = [
    "--address",
    "--leader-address",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--dist-init-addr",
    "--node-rank",
    "--node_rank",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--headless",
];

/// Path components that name credentials: never collected into a set.
const CREDENTIAL_NAMES: [&str; 16] = [
    ".ngc",
    ".netrc",
    ".docker",
    ".aws",
    ".azure",
    ".ssh",
    ".kube",
    ".gnupg",
    ".git-credentials",
    ".huggingface",
    "gcloud",
    "token",
    "stored_tokens",
    "credentials",
    "credentials.json",
    "config.json.lock",
];

/// File-name suffixes of keys and certificates: never collected into a set.
const CREDENTIAL_SUFFIXES: [&str; 5] = [".pem", ".key", ".p12", ".pfx", ".jks"];

/// The rank of a pod within its group: its LeaderWorkerSet worker index, `0` outside a group.
/// A label that is not a decimal number below 2^16 is `None` (the pod gets no set).
pub fn rank(pod: &Pod) -> Option<u32> {
    match pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LWS_WORKER_INDEX_LABEL))
    {
        None => Some(0),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|r| *r < 1 << 16 && v == &r.to_string()),
    }
}

/// What decides what an engine compiles, in a canonical form (ordered maps, no per-pod values).
#[derive(Serialize)]
struct Configuration<'a> {
    image: &'a str,
    words: Vec<String>,
    env: BTreeMap<&'a str, String>,
    gpus: Option<String>,
    gpu_product: Option<&'a str>,
}

fn without_wiring(words: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(words.len());
    let mut skip_value = false;
    for w in words {
        if skip_value {
            skip_value = false;
            if !w.starts_with('-') {
                continue;
            }
        }
        let (flag, inline) = match w.split_once('=') {
            Some((f, _)) => (f, true),
            None => (w.as_str(), false),
        };
        if WIRING_FLAGS.contains(&flag) {
            skip_value = !inline && flag != "--headless";
            continue;
        }
        // `$(LWS_LEADER_ADDRESS)` or `${LWS_...}` inside a word: the word is wiring.
        if WIRING_ENV_PREFIXES
            .iter()
            .any(|p| w.contains(&format!("$({p}")) || w.contains(&format!("${{{p}")))
        {
            continue;
        }
        out.push(w);
    }
    out
}

fn env_entry(e: &EnvVar) -> String {
    match (&e.value, &e.value_from) {
        (_, Some(from)) => {
            // A reference, never a value: the same reference in every pod of a template.
            if let Some(s) = &from.secret_key_ref {
                format!("secret:{}:{}", s.name, s.key)
            } else if let Some(c) = &from.config_map_key_ref {
                format!("configMap:{}:{}", c.name, c.key)
            } else if let Some(f) = &from.field_ref {
                format!("field:{}", f.field_path)
            } else if let Some(r) = &from.resource_field_ref {
                format!("resource:{}", r.resource)
            } else {
                "ref".to_owned()
            }
        }
        (Some(v), None) => format!("={v}"),
        (None, None) => "=".to_owned(),
    }
}

/// The digest (64 hex) of what decides what `main` (the pod's main container) compiles, apart
/// from the model copy and the rank ([`cache_set_handle`] adds those).
pub fn configuration_digest(pod: &Pod, main: &Container) -> String {
    let env = main
        .env
        .iter()
        .flatten()
        .filter(|e| !WIRING_ENV_PREFIXES.iter().any(|p| e.name.starts_with(p)))
        .map(|e| (e.name.as_str(), env_entry(e)))
        .collect();
    let gpu = |r: &BTreeMap<String, Quantity>| r.get("nvidia.com/gpu").map(|q| q.0.clone());
    let gpus = main.resources.as_ref().and_then(|r| {
        r.limits
            .as_ref()
            .and_then(gpu)
            .or_else(|| r.requests.as_ref().and_then(gpu))
    });
    let gpu_product = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|n| n.get("nvidia.com/gpu.product"))
        .map(String::as_str);
    let config = Configuration {
        image: main.image.as_deref().unwrap_or_default(),
        words: without_wiring(
            container_words(main)
                .into_iter()
                .map(Cow::into_owned)
                .collect(),
        ),
        env,
        gpus,
        gpu_product,
    };
    // Ordered maps and strings always serialize; were it ever to fail, every pod would share
    // the empty text's digest, which only costs a cache miss inside the engine.
    let text = serde_json::to_string(&config).unwrap_or_default();
    hex_of(&sha256_digest(&text)).to_owned()
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// The cache handle of the compile-cache set of a configuration ([`configuration_digest`]) at
/// `rank`, for pods reading the model copy `model`: `cache://<sha256 hex>?rank=<rank>`.
pub fn cache_set_handle(configuration: &str, model: &CacheHandle, rank: u32) -> String {
    let digest = sha256_digest(&format!("{configuration}\n{model}"));
    format!("cache://{}?rank={rank}", hex_of(&digest))
}

/// A pod's compile-cache set: which set, its binding, and the variables that point the
/// engine's caches into the scratch directory.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSet {
    pub(crate) configuration: String,
    pub(crate) rank: u32,
    pub(crate) handle: String,
    pub(crate) identity: BindingIdentity,
    pub(crate) binding_name: String,
    pub(crate) hash: String,
    pub(crate) env: Vec<(String, String)>,
    /// Image of the seed container (the wait image, else the main container's).
    pub(crate) image: String,
    pub(crate) image_pull_policy: Option<String>,
}

impl CacheSet {
    pub(crate) fn new(
        configuration: String,
        rank: u32,
        model: &CacheHandle,
        sharing: &SharingDomain,
        env: Vec<(String, String)>,
        image: (String, Option<String>),
    ) -> CacheSet {
        let handle = cache_set_handle(&configuration, model, rank);
        let identity = BindingIdentity::new(sharing.workflow, &sharing.domain, &handle);
        CacheSet {
            binding_name: binding_name(&identity),
            hash: identity_hash(&identity),
            configuration,
            rank,
            handle,
            identity,
            env,
            image: image.0,
            image_pull_policy: image.1,
        }
    }

    /// The same configuration for another copy of the model (a refresh window).
    pub(crate) fn for_model(&self, model: &CacheHandle, sharing: &SharingDomain) -> CacheSet {
        CacheSet::new(
            self.configuration.clone(),
            self.rank,
            model,
            sharing,
            self.env.clone(),
            (self.image.clone(), self.image_pull_policy.clone()),
        )
    }

    /// The set's handle (`cache://<sha256>?rank=<n>`).
    pub fn handle(&self) -> &str {
        &self.handle
    }

    /// The rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The name of the set's binding (`model-cache-<hash>`).
    pub fn binding_name(&self) -> &str {
        &self.binding_name
    }

    /// The set binding's identity.
    pub fn identity(&self) -> &BindingIdentity {
        &self.identity
    }

    /// The variables set on the main container.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    pub(crate) fn binding_target<'a>(&'a self, plan: &'a Plan) -> BindingTarget<'a> {
        BindingTarget {
            identity: &self.identity,
            name: &self.binding_name,
            control_namespace: plan.binding_namespace(),
            namespace: &plan.namespace,
            sharing: plan.sharing_domain(),
            handle: self.handle.clone(),
            traceparent: plan.traceparent.as_deref(),
        }
    }
}

/// How an admitted pod takes part in its compile-cache set, for metrics and logs: `capture`
/// (its caches may be collected once Ready), `seed` (it starts from the set), `local` (the set
/// is complete but its namespace has no view yet); `None` when it has no set.
pub fn role_of(pod: &Pod) -> Option<&'static str> {
    let labels = pod.metadata.labels.as_ref()?;
    labels.get(CACHE_KEY_LABEL)?;
    if labels.get(CACHE_CAPTURE_LABEL).map(String::as_str) == Some("true") {
        return Some("capture");
    }
    let seeded = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|ic| ic.iter().any(|c| c.name == SEED_CONTAINER));
    Some(if seeded { "seed" } else { "local" })
}

/// Whether `handle` is the handle of a compile-cache set (`cache://<64 hex>?rank=<n>`).
pub fn is_cache_set_handle(handle: &str) -> bool {
    let Some(rest) = handle.strip_prefix("cache://") else {
        return false;
    };
    let Some((hex, rank)) = rest.split_once("?rank=") else {
        return false;
    };
    hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && !rank.is_empty()
        && rank.len() <= 5
        && rank.bytes().all(|b| b.is_ascii_digit())
        && (rank == "0" || !rank.starts_with('0'))
}

/// The compile-cache variables to set on `main`: each one the container does not set itself
/// (in its env or its script), pointing into the scratch directory. A variable the chart sets
/// stays as it is (and its cache is not part of the set). A script that only reads one (`mkdir
/// -p "$TRITON_CACHE_DIR"`) reads the scratch path, where the engine puts that cache.
pub fn compile_cache_env(main: &Container) -> Vec<(String, String)> {
    COMPILE_CACHE_VARIABLES
        .iter()
        .filter(|(name, _)| {
            !main.env.iter().flatten().any(|e| e.name == *name)
                && crate::words::script_assignments(main, &[name]).is_empty()
        })
        .map(|(name, sub)| ((*name).to_owned(), format!("{SCRATCH_PATH}/{sub}")))
        .collect()
}

/// Whether the file or directory at `rel` (relative to the scratch directory, `/`-separated)
/// may travel in a set: inside one of the compile-cache directories, and naming no credential.
pub fn travels(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return false;
    }
    let inside = COMPILE_CACHE_VARIABLES
        .iter()
        .map(|(_, sub)| *sub)
        .chain([MODULES_CACHE_DIR])
        .any(|sub| {
            let sub: Vec<&str> = sub.split('/').collect();
            // A directory on the way to a cache directory, or something inside one.
            parts.iter().zip(&sub).all(|(a, b)| a == b)
        });
    inside
        && !parts.iter().any(|p| {
            let lower = p.to_ascii_lowercase();
            CREDENTIAL_NAMES.contains(&lower.as_str())
                || CREDENTIAL_SUFFIXES.iter().any(|s| lower.ends_with(s))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::Layout;
    use warmcache_modelid::Identity;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const VLLM: &str = r"
metadata:
  name: p
  labels: {app: vllm}
spec:
  nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
  containers:
  - name: vllm
    image: vllm/vllm-openai:v0.9.0
    command: [vllm, serve, Qwen/Qwen3-8B, --tensor-parallel-size, '2']
    env:
    - {name: HF_TOKEN, valueFrom: {secretKeyRef: {name: hf, key: token}}}
    - {name: VLLM_USE_V1, value: '1'}
    resources: {limits: {nvidia.com/gpu: '2'}}
";

    fn model() -> CacheHandle {
        CacheHandle::new(
            Identity::hf("Qwen/Qwen3-8B", None).unwrap(),
            Layout::Hub,
            &[],
        )
    }

    fn handle_of(p: &Pod) -> String {
        let main = &p.spec.as_ref().unwrap().containers[0];
        cache_set_handle(&configuration_digest(p, main), &model(), rank(p).unwrap())
    }

    #[test]
    fn one_configuration_one_handle_and_each_part_changes_it() {
        let base = pod(VLLM);
        let h = handle_of(&base);
        assert!(is_cache_set_handle(&h), "{h}");
        assert!(h.ends_with("?rank=0"));
        // Another pod of the same template: same set.
        let mut twin = base.clone();
        twin.metadata.name = Some("q".into());
        assert_eq!(handle_of(&twin), h);
        for (what, changed) in [
            ("image", VLLM.replace("v0.9.0", "v0.9.1")),
            ("a flag", VLLM.replace("'2']", "'4']")),
            (
                "a literal variable",
                VLLM.replace("value: '1'", "value: '0'"),
            ),
            (
                "the secret referenced",
                VLLM.replace("name: hf, key", "name: other, key"),
            ),
            (
                "the GPUs",
                VLLM.replace("nvidia.com/gpu: '2'", "nvidia.com/gpu: '4'"),
            ),
            (
                "the GPU product",
                VLLM.replace("H100-80GB-HBM3", "A100-SXM4-80GB"),
            ),
        ] {
            assert_ne!(handle_of(&pod(&changed)), h, "{what} changes the set");
        }
        // The salt (part of the model handle) changes it.
        let main = &base.spec.as_ref().unwrap().containers[0];
        let salted = model().with_salt(Some("wheel-2"));
        assert_ne!(
            cache_set_handle(&configuration_digest(&base, main), &salted, 0),
            h
        );
    }

    #[test]
    fn group_wiring_does_not_change_the_set_but_the_rank_does() {
        let worker = |index: &str, leader: &str| {
            pod(&format!(
                r#"
metadata:
  name: w
  labels: {{leaderworkerset.sigs.k8s.io/worker-index: "{index}"}}
spec:
  containers:
  - name: vllm
    image: vllm/vllm-openai:v0.9.0
    command: [sh, -c, "ray start --address=$(LWS_LEADER_ADDRESS):6379 --block"]
    args: [--master-addr, {leader}, --node-rank, '{index}']
    env:
    - {{name: LWS_LEADER_ADDRESS, value: {leader}}}
    - {{name: LWS_GROUP_SIZE, value: '2'}}
    resources: {{limits: {{nvidia.com/gpu: '8'}}}}
"#
            ))
        };
        let a = handle_of(&worker("1", "g0.svc"));
        let b = handle_of(&worker("1", "g7.svc"));
        assert_eq!(a, b, "another group's address is the same configuration");
        let c = handle_of(&worker("2", "g0.svc"));
        assert_ne!(a, c);
        assert!(a.ends_with("?rank=1") && c.ends_with("?rank=2"), "{a} {c}");
    }

    #[test]
    fn a_malformed_worker_index_gets_no_rank() {
        for bad in ["-1", "01", "x", "65536", ""] {
            let p = pod(&format!(
                "metadata: {{labels: {{leaderworkerset.sigs.k8s.io/worker-index: '{bad}'}}}}"
            ));
            assert_eq!(rank(&p), None, "{bad:?}");
        }
        assert_eq!(rank(&pod("metadata: {}")), Some(0));
    }

    #[test]
    fn handles_are_recognised_exactly() {
        let hex = "a".repeat(64);
        assert!(is_cache_set_handle(&format!("cache://{hex}?rank=0")));
        assert!(is_cache_set_handle(&format!("cache://{hex}?rank=12")));
        for bad in [
            format!("cache://{hex}"),
            format!("cache://{hex}?rank="),
            format!("cache://{hex}?rank=01"),
            format!("cache://{}?rank=0", "A".repeat(64)),
            format!("cache://{}?rank=0", "a".repeat(63)),
            format!("hf://{hex}?rank=0"),
            format!("cache://{hex}?rank=0&x=1"),
        ] {
            assert!(!is_cache_set_handle(&bad), "{bad}");
        }
    }

    #[test]
    fn the_engine_keeps_what_it_sets_and_the_rest_points_into_the_scratch_directory() {
        let p = pod(r#"
spec:
  containers:
  - name: e
    image: i
    command: [sh, -c, "export VLLM_CACHE_ROOT=/data/vllm; echo $CUDA_CACHE_PATH; exec vllm serve m"]
    env:
    - {name: TRITON_CACHE_DIR, value: /cache/triton}
"#);
        let env = compile_cache_env(&p.spec.as_ref().unwrap().containers[0]);
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "TORCHINDUCTOR_CACHE_DIR",
                "CUDA_CACHE_PATH",
                "FLASHINFER_WORKSPACE_BASE",
                "DG_JIT_CACHE_DIR"
            ],
            "what the script sets and the env sets are kept; what it only reads is pointed"
        );
        assert_eq!(env[0].1, "/opt/nvsnap/cache/torchinductor");
    }

    #[test]
    fn only_compile_caches_travel_and_never_a_credential() {
        for ok in [
            "torchinductor",
            "torchinductor/fxgraph/ab/cd",
            ".triton",
            ".triton/cache/xyz/kernel.cubin",
            ".cache/vllm/torch_compile_cache/rank_0_0/model",
            ".nv/ComputeCache/index",
            "hf_modules/transformers_modules/org/model/modeling.py",
            ".deep_gemm/cache/kernel.so",
        ] {
            assert!(travels(ok), "{ok}");
        }
        for no in [
            ".ngc/config",
            ".cache/huggingface/token",
            ".cache/huggingface/stored_tokens",
            "hf_modules/../.ngc/config",
            "torchinductor/.aws/credentials",
            "torchinductor/x/client.KEY",
            "torchinductor/tls.pem",
            ".netrc",
            "other/file",
            ".cache/pip/wheel",
            ".docker/config.json",
        ] {
            assert!(!travels(no), "{no}");
        }
    }
}
