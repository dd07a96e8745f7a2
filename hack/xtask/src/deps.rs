//! `cargo xtask deps-check`: the dependency direction of docs/architecture.md section 4, checked over
//! `cargo metadata`.
//!
//! - `api/*` depends on no internal crate and carries types only: no tokio, and `kube` with the
//!   `derive` feature at most (no client, no TLS, no runtime).
//! - `pkg/*` depends only on `api/*` and other `pkg/*` crates; the pure crates listed in
//!   [`PURE_CRATES`] depend on no Kubernetes client, no HTTP stack and no tokio, and only on
//!   `api/*` and other pure crates internally.
//! - `cmd/*` never depends on another `cmd/*` crate.
//! - `warmcache-testkit` is dev-only: nothing takes it as a normal or build dependency, except
//!   the `test/*` crates, which ship nothing (their binaries, such as the demo, are dev tools).
//! - `test/*` (black-box tests) depends on no `cmd/*` crate.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Crates whose decisions must stay pure: no client, no tokio (docs/architecture.md section 4).
pub const PURE_CRATES: [&str; 5] = [
    "warmcache-cli",
    "warmcache-catalog",
    "warmcache-modelid",
    "warmcache-modelvolume",
    "warmcache-kvcache",
];

/// Third-party crates a pure or API crate must not depend on.
const CLIENT_CRATES: [&str; 9] = [
    "tokio",
    "kube-client",
    "kube-runtime",
    "hyper",
    "hyper-util",
    "reqwest",
    "tower",
    "axum",
    "tonic",
];

/// `kube` features allowed in API and pure crates.
const ALLOWED_KUBE_FEATURES: [&str; 1] = ["derive"];

const TESTKIT: &str = "warmcache-testkit";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    Api,
    Pkg,
    Cmd,
    Test,
    Hack,
}

#[derive(Debug)]
struct Member {
    name: String,
    layer: Layer,
    deps: Vec<Dep>,
}

#[derive(Debug)]
struct Dep {
    name: String,
    /// `None` for a normal dependency, `Some("dev")` or `Some("build")` otherwise.
    kind: Option<String>,
    default_features: bool,
    features: Vec<String>,
}

pub fn run(root: &Path) -> Result<bool> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Value =
        serde_json::from_slice(&output.stdout).context("parsing cargo metadata output")?;
    let members = members(&metadata, root)?;
    let mut violations = check(&members);
    for m in &members {
        if m.layer == Layer::Api || PURE_CRATES.contains(&m.name.as_str()) {
            violations.extend(reached_clients(root, &m.name)?);
        }
    }
    for v in &violations {
        eprintln!("deps-check: {v}");
    }
    if violations.is_empty() {
        println!(
            "deps-check: {} crates follow the dependency direction",
            members.len()
        );
    }
    Ok(violations.is_empty())
}

/// Client crates that `name` reaches through any chain of normal dependencies, with features
/// resolved as when building `name` alone (`cargo tree -p`), so a third-party crate cannot bring
/// tokio or an HTTP stack into an API or pure crate unnoticed.
fn reached_clients(root: &Path, name: &str) -> Result<Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "tree", "--locked", "-p", name, "-e", "normal", "--prefix", "none",
        ])
        .args(["--format", "{p}"])
        .current_dir(root)
        .output()
        .with_context(|| format!("running cargo tree -p {name}"))?;
    if !output.status.success() {
        bail!(
            "cargo tree -p {name} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(clients_in_tree(
        name,
        &String::from_utf8_lossy(&output.stdout),
    ))
}

/// The violations in the output of `cargo tree --prefix none --format {p}` for `name`.
fn clients_in_tree(name: &str, tree: &str) -> Vec<String> {
    let mut found: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|krate| CLIENT_CRATES.contains(krate))
        .collect();
    found.sort_unstable();
    found.dedup();
    found
        .into_iter()
        .map(|krate| {
            format!(
                "{name} reaches {krate} through its dependencies; API and pure crates must not reach a client, an HTTP stack or an async runtime (see `cargo tree -p {name} -i {krate} -e normal`)"
            )
        })
        .collect()
}

fn members(metadata: &Value, root: &Path) -> Result<Vec<Member>> {
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let mut out = Vec::new();
    for pkg in packages {
        let name = pkg["name"]
            .as_str()
            .context("package without a name")?
            .to_owned();
        let manifest = pkg["manifest_path"]
            .as_str()
            .context("package without manifest_path")?;
        let rel = Path::new(manifest)
            .strip_prefix(root)
            .unwrap_or(Path::new(manifest));
        let layer = match rel.components().next().and_then(|c| c.as_os_str().to_str()) {
            Some("api") => Layer::Api,
            Some("pkg") => Layer::Pkg,
            Some("cmd") => Layer::Cmd,
            Some("test") => Layer::Test,
            Some("hack") => Layer::Hack,
            other => bail!("crate {name} lives outside the known layout ({other:?})"),
        };
        let mut deps = Vec::new();
        for d in pkg["dependencies"].as_array().into_iter().flatten() {
            deps.push(Dep {
                name: d["name"].as_str().unwrap_or_default().to_owned(),
                kind: d["kind"].as_str().map(str::to_owned),
                default_features: d["uses_default_features"].as_bool().unwrap_or(true),
                features: d["features"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.as_str().map(str::to_owned))
                    .collect(),
            });
        }
        out.push(Member { name, layer, deps });
    }
    Ok(out)
}

fn check(members: &[Member]) -> Vec<String> {
    let layer_of = |name: &str| members.iter().find(|m| m.name == name).map(|m| m.layer);
    let mut violations = Vec::new();
    for m in members {
        let pure = PURE_CRATES.contains(&m.name.as_str());
        for d in &m.deps {
            let normal = d.kind.is_none();
            if d.name == TESTKIT
                && d.kind.as_deref() != Some("dev")
                && m.name != TESTKIT
                && m.layer != Layer::Test
            {
                violations.push(format!(
                    "{} takes {TESTKIT} as a non-dev dependency; the test kit is dev-only",
                    m.name
                ));
            }
            if !normal {
                continue;
            }
            let internal = layer_of(&d.name);
            match (m.layer, internal) {
                (Layer::Api, Some(_)) => violations.push(format!(
                    "{} (api) depends on internal crate {}; API crates depend on nothing internal",
                    m.name, d.name
                )),
                (Layer::Pkg, Some(Layer::Cmd | Layer::Test | Layer::Hack)) => {
                    violations.push(format!(
                        "{} (pkg) depends on {}; pkg crates depend only on api and pkg",
                        m.name, d.name
                    ))
                }
                (Layer::Cmd, Some(Layer::Cmd | Layer::Test | Layer::Hack)) => {
                    violations.push(format!(
                        "{} (cmd) depends on {}; share logic through pkg/* instead",
                        m.name, d.name
                    ))
                }
                (Layer::Test, Some(Layer::Cmd)) => violations.push(format!(
                    "{} (test) depends on {}; black-box tests must not link a binary's crate",
                    m.name, d.name
                )),
                _ => {}
            }
            if pure && internal == Some(Layer::Pkg) && !PURE_CRATES.contains(&d.name.as_str()) {
                violations.push(format!(
                    "{} is pure but depends on {}, which is not",
                    m.name, d.name
                ));
            }
            if m.layer == Layer::Api || pure {
                let what = if pure { "pure" } else { "api" };
                if CLIENT_CRATES.contains(&d.name.as_str()) {
                    violations.push(format!(
                        "{} ({what}) depends on {}; it must not reach a client, an HTTP stack or an async runtime",
                        m.name, d.name
                    ));
                }
                if d.name == "kube" {
                    let extra: Vec<&String> = d
                        .features
                        .iter()
                        .filter(|f| !ALLOWED_KUBE_FEATURES.contains(&f.as_str()))
                        .collect();
                    if d.default_features || !extra.is_empty() {
                        violations.push(format!(
                            "{} ({what}) enables kube default features or {extra:?}; only {ALLOWED_KUBE_FEATURES:?} is allowed",
                            m.name
                        ));
                    }
                }
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(name: &str, kind: Option<&str>) -> Dep {
        Dep {
            name: name.into(),
            kind: kind.map(Into::into),
            default_features: false,
            features: vec![],
        }
    }

    fn member(name: &str, layer: Layer, deps: Vec<Dep>) -> Member {
        Member {
            name: name.into(),
            layer,
            deps,
        }
    }

    fn base() -> Vec<Member> {
        vec![
            member(
                "warmcache-api-kvcache",
                Layer::Api,
                vec![dep("serde", None), dep(TESTKIT, Some("dev"))],
            ),
            member(
                "warmcache-kvcache",
                Layer::Pkg,
                vec![dep("warmcache-api-kvcache", None)],
            ),
            member("warmcache-kube", Layer::Pkg, vec![dep("tokio", None)]),
            member(TESTKIT, Layer::Pkg, vec![dep("tokio", None)]),
            member(
                "warmcache-webhook",
                Layer::Cmd,
                vec![dep("warmcache-kube", None)],
            ),
            member("warmcache-reaper", Layer::Cmd, vec![]),
            member("warmcache-e2e", Layer::Test, vec![]),
        ]
    }

    #[test]
    fn the_intended_layout_passes() {
        assert_eq!(check(&base()), Vec::<String>::new());
    }

    #[test]
    fn each_wrong_edge_is_reported() {
        let cases: Vec<(&str, Dep)> = vec![
            ("warmcache-api-kvcache", dep("warmcache-kube", None)),
            ("warmcache-api-kvcache", dep("tokio", None)),
            ("warmcache-kvcache", dep("tokio", None)),
            ("warmcache-kvcache", dep("warmcache-kube", None)),
            ("warmcache-kube", dep("warmcache-webhook", None)),
            ("warmcache-webhook", dep("warmcache-reaper", None)),
            ("warmcache-webhook", dep(TESTKIT, None)),
            ("warmcache-e2e", dep("warmcache-webhook", None)),
            (
                "warmcache-api-kvcache",
                Dep {
                    name: "kube".into(),
                    kind: None,
                    default_features: false,
                    features: vec!["client".into()],
                },
            ),
            (
                "warmcache-kvcache",
                Dep {
                    name: "kube".into(),
                    kind: None,
                    default_features: true,
                    features: vec![],
                },
            ),
        ];
        for (who, bad) in cases {
            let mut ms = base();
            let label = format!("{who} -> {}", bad.name);
            ms.iter_mut()
                .find(|m| m.name == who)
                .unwrap()
                .deps
                .push(bad);
            assert_eq!(check(&ms).len(), 1, "{label} was not reported exactly once");
        }
    }

    #[test]
    fn transitive_clients_are_found_in_a_dependency_tree() {
        let tree = "warmcache-kvcache v0.1.0 (/w/pkg/kvcache)\nkube v5.0.0\nkube-client v5.0.0\ntokio v1.54.1\ntokio v1.54.1 (*)\nserde v1.0.0\n";
        let found = clients_in_tree("warmcache-kvcache", tree);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("reaches kube-client"));
        assert!(found[1].contains("reaches tokio"));
        assert!(clients_in_tree("x", "serde v1\nkube-core v5\n").is_empty());
    }

    #[test]
    fn dev_dependencies_on_the_testkit_are_fine_everywhere() {
        let mut ms = base();
        ms[4].deps.push(dep(TESTKIT, Some("dev")));
        assert!(check(&ms).is_empty());
    }

    #[test]
    fn only_test_crates_take_the_testkit_as_a_normal_dependency() {
        let mut ms = base();
        let e2e = ms.iter_mut().find(|m| m.name == "warmcache-e2e").unwrap();
        e2e.deps.push(dep(TESTKIT, None));
        assert!(check(&ms).is_empty(), "{:?}", check(&ms));
        let webhook = ms
            .iter_mut()
            .find(|m| m.name == "warmcache-webhook")
            .unwrap();
        webhook.deps.push(dep(TESTKIT, None));
        assert_eq!(check(&ms).len(), 1);
    }
}
