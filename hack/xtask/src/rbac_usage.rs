//! `cargo xtask rbac-usage DIR`: proves that no granted verb goes unused.
//!
//! Every test plane's API server writes an audit log of the requests ServiceAccounts make
//! (`WARMCACHE_AUDIT_DIR`, set by `hack/test.sh` for the whole test run; see
//! `warmcache_testkit::ENV_AUDIT_DIR`). The component tests run each component as the
//! ServiceAccount with the generated roles (`warmcache_testkit::ComponentAccount`), so an allowed
//! request's audit annotation `authorization.k8s.io/reason` names the role that allowed it
//! (`RBAC: allowed by ClusterRoleBinding "..." of ClusterRole "warmcache-reaper" to ...`). This
//! task reads every log, attributes each allowed request to the component, scope and rule of the
//! generated role that allowed it, and fails when a (resource, verb) of a component's permission
//! list was never used: a grant the code does not exercise is either dead (remove it from the
//! component's `src/rbac.rs`) or untested (add the test).
//!
//! Grants that no test exercises yet are listed, each with why, in `hack/rbac-usage-pending.txt`
//! (one `<component> (<scope>): <verb> <resource>[.<group>]` per line, as this task prints
//! them): they are reported but do not fail, so the list only shrinks. A new grant must be used
//! by a test from the start; a listed grant that a run did use is reported so it can be removed.
//!
//! A request a role allows because another rule of the same component already allowed it (a
//! ClusterRole before a Role: the RBAC authorizer checks ClusterRoleBindings first) counts for
//! the rule that allowed it, so a Role rule that only repeats a ClusterRole rule shows as unused.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use warmcache_kube::rbac::{Permission, Scope};

use crate::generate::rbac::{components, generated_roles};

/// One audit event, the fields this task reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    api_group: String,
}

/// Which role allowed a request: its kind (`Role` or `ClusterRole`) and name, from the
/// authorizer's reason.
fn allowed_by(reason: &str) -> Option<(&str, &str)> {
    let rest = reason.strip_prefix("RBAC: allowed by ")?;
    let (_, after) = rest.split_once(" of ")?;
    let (kind, after) = after.split_once(' ')?;
    if kind != "Role" && kind != "ClusterRole" {
        return None;
    }
    let name = after.strip_prefix('"')?;
    let (name, _) = name.split_once('"')?;
    Some((kind, name))
}

/// (component, scope, group, resource[/subresource], verb)
type UseKey = (String, Scope, String, String, String);

/// Counts of allowed requests per generated rule, read from every `*.jsonl` file of `dir`.
fn read_uses(
    dir: &Path,
    roles: &BTreeMap<(String, String), (String, Scope)>,
) -> Result<(BTreeMap<UseKey, u64>, usize, u64)> {
    let mut uses = BTreeMap::new();
    let mut files = 0;
    let mut events = 0u64;
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            continue;
        }
        files += 1;
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        for (number, line) in BufReader::new(file).lines().enumerate() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            // A plane killed mid-write can leave a torn last line; anything else is an error.
            let event: AuditEvent = match serde_json::from_str(&line) {
                Ok(event) => event,
                Err(e) if e.is_eof() => continue,
                Err(e) => bail!("{}:{}: not an audit event: {e}", path.display(), number + 1),
            };
            events += 1;
            if event.stage != "ResponseComplete" {
                continue;
            }
            if event.annotations.get("authorization.k8s.io/decision") != Some(&"allow".to_owned()) {
                continue;
            }
            let (Some(reason), Some(object)) = (
                event.annotations.get("authorization.k8s.io/reason"),
                &event.object_ref,
            ) else {
                continue;
            };
            let Some((kind, name)) = allowed_by(reason) else {
                continue;
            };
            let Some((component, scope)) = roles.get(&(kind.to_owned(), name.to_owned())) else {
                continue;
            };
            let resource = if object.subresource.is_empty() {
                object.resource.clone()
            } else {
                format!("{}/{}", object.resource, object.subresource)
            };
            *uses
                .entry((
                    component.clone(),
                    *scope,
                    object.api_group.clone(),
                    resource,
                    event.verb.clone(),
                ))
                .or_insert(0) += 1;
        }
    }
    Ok((uses, files, events))
}

/// One granted verb as this task prints it and `hack/rbac-usage-pending.txt` lists it:
/// `<component> (<scope>): <verb> <resource>[.<group>]`.
fn grant(component: &str, p: &Permission, verb: &str) -> String {
    let group = if p.group.is_empty() {
        String::new()
    } else {
        format!(".{}", p.group)
    };
    format!("{component} ({}): {verb} {}{group}", p.scope, p.resource)
}

/// The grants of `hack/rbac-usage-pending.txt`: no test exercises them yet.
fn read_pending(path: &Path) -> Result<BTreeSet<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text
        .lines()
        .map(|line| line.split_once('#').map_or(line, |(grant, _)| grant).trim())
        .filter(|grant| !grant.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The task. `Ok(false)`: some granted verb was never used and is not in `pending` (listed on
/// stderr).
pub fn run(dir: &Path, pending: &Path) -> Result<bool> {
    let pending_grants = read_pending(pending)?;
    let mut roles = BTreeMap::new();
    let components = components();
    for (component, permissions) in &components {
        let rendered = generated_roles(component, permissions)?;
        let named = [
            (
                "ClusterRole",
                Scope::Cluster,
                rendered.cluster.and_then(|r| r.metadata.name),
            ),
            (
                "Role",
                Scope::OwnNamespace,
                rendered.own_namespace.and_then(|r| r.metadata.name),
            ),
            (
                "Role",
                Scope::ControlNamespace,
                rendered.control_namespace.and_then(|r| r.metadata.name),
            ),
        ];
        for (kind, scope, name) in named {
            if let Some(name) = name {
                roles.insert((kind.to_owned(), name), (component.to_string(), scope));
            }
        }
    }
    let (uses, files, events) = read_uses(dir, &roles)?;
    if files == 0 {
        bail!(
            "{} holds no audit log (*.jsonl): run the tests with WARMCACHE_AUDIT_DIR set to it",
            dir.display()
        );
    }
    let mut unused = Vec::new();
    let mut still_pending = Vec::new();
    let mut now_used = Vec::new();
    let mut known = BTreeSet::new();
    let mut used = BTreeSet::new();
    for (component, permissions) in &components {
        for p in permissions {
            for verb in p.verbs {
                let key = (
                    component.to_string(),
                    p.scope,
                    p.group.to_owned(),
                    p.resource.to_owned(),
                    (*verb).to_owned(),
                );
                let count = uses.get(&key).copied().unwrap_or(0);
                let line = grant(component, p, verb);
                let listed = pending_grants.contains(&line);
                match (count, listed) {
                    (0, true) => still_pending.push(line.clone()),
                    (0, false) => unused.push(format!("{line} - {}", p.why)),
                    (_, true) => now_used.push(line.clone()),
                    (_, false) => {}
                }
                if count > 0 {
                    used.insert(format!("{line}: {count} requests"));
                }
                known.insert(line);
            }
        }
    }
    let stale: Vec<_> = pending_grants.difference(&known).collect();
    println!(
        "rbac-usage: {events} audit events in {files} logs; {} granted verbs used, {} unused \
         and listed in {} (no test yet), {} unused and not listed",
        used.len(),
        still_pending.len(),
        pending.display(),
        unused.len()
    );
    for line in &used {
        println!("  used    {line}");
    }
    for line in &still_pending {
        println!("  pending {line}");
    }
    for line in &now_used {
        println!("  used now, remove it from {}: {line}", pending.display());
    }
    for line in &stale {
        println!(
            "  granted no more, remove it from {}: {line}",
            pending.display()
        );
    }
    for line in &unused {
        eprintln!("  UNUSED  {line}");
    }
    if !unused.is_empty() {
        eprintln!(
            "rbac-usage: a granted verb no test exercised: remove it from the component's src/rbac.rs \
             (and run `cargo xtask gen`), or add the test that makes the call as the component's \
             ServiceAccount"
        );
    }
    Ok(unused.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_names_the_role_that_allowed_the_request() {
        assert_eq!(
            allowed_by(
                r#"RBAC: allowed by ClusterRoleBinding "warmcache-reaper-ns1" of ClusterRole "warmcache-reaper" to ServiceAccount "warmcache-reaper/ns1""#
            ),
            Some(("ClusterRole", "warmcache-reaper"))
        );
        assert_eq!(
            allowed_by(
                r#"RBAC: allowed by RoleBinding "warmcache-reaper-control-ns1/ctl" of Role "warmcache-reaper-control" to ServiceAccount "warmcache-reaper/ns1""#
            ),
            Some(("Role", "warmcache-reaper-control"))
        );
        assert_eq!(allowed_by("allowed by the Node authorizer"), None);
    }

    fn event(reason: &str, verb: &str, group: &str, resource: &str, sub: &str) -> String {
        serde_json::json!({
            "kind": "Event", "stage": "ResponseComplete", "verb": verb,
            "objectRef": {"resource": resource, "subresource": sub, "apiGroup": group},
            "annotations": {"authorization.k8s.io/decision": "allow", "authorization.k8s.io/reason": reason},
        })
        .to_string()
    }

    #[test]
    fn requests_count_for_the_rule_of_the_role_that_allowed_them() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = r#"RBAC: allowed by ClusterRoleBinding "b" of ClusterRole "warmcache-reaper" to ServiceAccount "warmcache-reaper/x""#;
        let control = r#"RBAC: allowed by RoleBinding "b/ctl" of Role "warmcache-reaper-control" to ServiceAccount "warmcache-reaper/x""#;
        let lines = [
            event(cluster, "list", "", "pods", ""),
            event(cluster, "list", "", "pods", ""),
            event(
                control,
                "update",
                "nvca.nvcf.nvidia.io",
                "modelcachebindings",
                "status",
            ),
            // Not ours, denied, or another stage: ignored.
            event(
                r#"RBAC: allowed by ClusterRoleBinding "b" of ClusterRole "admin" to User "u""#,
                "get",
                "",
                "pods",
                "",
            ),
            serde_json::json!({"stage": "ResponseComplete", "verb": "get",
                "objectRef": {"resource": "pods"},
                "annotations": {"authorization.k8s.io/decision": "forbid"}})
            .to_string(),
            "{\"stage\": \"ResponseComp".to_owned(),
        ];
        std::fs::write(dir.path().join("p.audit.jsonl"), lines.join("\n")).unwrap();
        let mut roles = BTreeMap::new();
        roles.insert(
            ("ClusterRole".to_owned(), "warmcache-reaper".to_owned()),
            ("reaper".to_owned(), Scope::Cluster),
        );
        roles.insert(
            ("Role".to_owned(), "warmcache-reaper-control".to_owned()),
            ("reaper".to_owned(), Scope::ControlNamespace),
        );
        let (uses, files, events) = read_uses(dir.path(), &roles).unwrap();
        assert_eq!((files, events), (1, 5));
        let key = |scope, group: &str, resource: &str, verb: &str| {
            (
                "reaper".to_owned(),
                scope,
                group.to_owned(),
                resource.to_owned(),
                verb.to_owned(),
            )
        };
        assert_eq!(uses.get(&key(Scope::Cluster, "", "pods", "list")), Some(&2));
        assert_eq!(
            uses.get(&key(
                Scope::ControlNamespace,
                "nvca.nvcf.nvidia.io",
                "modelcachebindings/status",
                "update"
            )),
            Some(&1)
        );
        assert_eq!(uses.len(), 2);
    }

    #[test]
    fn pending_grants_are_read_without_their_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pending.txt");
        std::fs::write(
            &path,
            "# header\n\nreaper (cluster): patch events.events.k8s.io  # a series needs a repeat\n",
        )
        .unwrap();
        assert_eq!(
            read_pending(&path).unwrap().into_iter().collect::<Vec<_>>(),
            ["reaper (cluster): patch events.events.k8s.io"]
        );
        assert!(read_pending(&dir.path().join("absent")).unwrap().is_empty());
    }

    #[test]
    fn an_unlisted_unused_grant_fails_and_a_listed_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        // One request: the uninstall hook listing bindings; every other grant is unused.
        let reason = r#"RBAC: allowed by ClusterRoleBinding "b" of ClusterRole "warmcache-uninstall-hook" to ServiceAccount "warmcache-uninstall-hook/x""#;
        std::fs::write(
            dir.path().join("p.audit.jsonl"),
            event(
                reason,
                "list",
                "nvca.nvcf.nvidia.io",
                "modelcachebindings",
                "",
            ),
        )
        .unwrap();
        let pending = dir.path().join("pending.txt");
        assert!(!run(dir.path(), &pending).unwrap());
        let mut every = String::new();
        for (component, permissions) in components() {
            for p in &permissions {
                for verb in p.verbs {
                    every.push_str(&grant(component, p, verb));
                    every.push('\n');
                }
            }
        }
        std::fs::write(&pending, every).unwrap();
        assert!(run(dir.path(), &pending).unwrap());
    }

    #[test]
    fn a_directory_without_logs_is_an_error_not_a_pass() {
        let dir = tempfile::tempdir().unwrap();
        assert!(run(dir.path(), &dir.path().join("pending.txt")).is_err());
    }
}
