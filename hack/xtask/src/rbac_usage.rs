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
//! Some verbs are authorized inside another request and have no audit event of their own: a
//! server-side apply that creates its object is authorized as `create` too, and writing a Role
//! needs the writer to hold every rule it grants. Such a request counts for those verbs as well
//! (see `implied_uses`).
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
    #[serde(default)]
    response_status: Option<ResponseStatus>,
    /// Logged for the Roles a ServiceAccount writes (the test planes' audit policy).
    #[serde(default)]
    response_object: Option<WrittenRole>,
}

#[derive(Debug, Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: Option<u16>,
}

/// The rules of a Role or ClusterRole as the API server stored it.
#[derive(Debug, Deserialize)]
struct WrittenRole {
    #[serde(default)]
    rules: Vec<WrittenRule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenRule {
    #[serde(default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
}

/// The verbs a request used beyond its own: the API server authorizes them inside the request,
/// so the audit log has no request of their own.
///
/// - A server-side apply that created its object (`patch`, 201) was authorized as `create` too.
/// - Creating a Role or ClusterRole (201) is no escalation only when the writer holds every
///   rule it grants (without `escalate`), so each (group, resource, verb) of the stored rules was
///   checked against the writer's own grants.
fn implied_uses(event: &AuditEvent, object: &ObjectRef) -> Vec<(String, String, String)> {
    let created = event.response_status.as_ref().and_then(|s| s.code) == Some(201);
    if !created {
        return Vec::new();
    }
    let mut implied = Vec::new();
    if event.verb == "patch" {
        implied.push((
            object.api_group.clone(),
            object.resource.clone(),
            "create".to_owned(),
        ));
    }
    let is_role = object.api_group == "rbac.authorization.k8s.io"
        && (object.resource == "roles" || object.resource == "clusterroles")
        && object.subresource.is_empty();
    if let (true, Some(role)) = (is_role, &event.response_object) {
        for rule in &role.rules {
            for group in &rule.api_groups {
                for resource in &rule.resources {
                    for verb in &rule.verbs {
                        if group != "*" && resource != "*" && verb != "*" {
                            implied.push((group.clone(), resource.clone(), verb.clone()));
                        }
                    }
                }
            }
        }
    }
    implied
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
            for (group, resource, verb) in implied_uses(&event, object) {
                *uses
                    .entry((component.clone(), *scope, group, resource, verb))
                    .or_insert(0) += 1;
            }
        }
    }
    Ok((uses, files, events))
}

/// One granted verb as this task prints it: `<component> (<scope>): <verb> <resource>[.<group>]`.
fn grant(component: &str, p: &Permission, verb: &str) -> String {
    let group = if p.group.is_empty() {
        String::new()
    } else {
        format!(".{}", p.group)
    };
    format!("{component} ({}): {verb} {}{group}", p.scope, p.resource)
}

/// The task. `Ok(false)`: some granted verb was never used (listed on stderr).
pub fn run(dir: &Path) -> Result<bool> {
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
                let line = grant(component, p, verb);
                match uses.get(&key).copied().unwrap_or(0) {
                    0 => unused.push(format!("{line} - {}", p.why)),
                    count => {
                        used.insert(format!("{line}: {count} requests"));
                    }
                }
            }
        }
    }
    println!(
        "rbac-usage: {events} audit events in {files} logs; {} granted verbs used, {} unused",
        used.len(),
        unused.len()
    );
    for line in &used {
        println!("  used    {line}");
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
    fn an_apply_that_creates_and_a_role_written_count_for_the_verbs_checked_inside_them() {
        let dir = tempfile::tempdir().unwrap();
        let own = r#"RBAC: allowed by RoleBinding "b/x" of Role "warmcache-kvcache-operator" to ServiceAccount "x/warmcache-kvcache-operator""#;
        let with = |mut line: serde_json::Value, code: u16, object: Option<serde_json::Value>| {
            line["responseStatus"] = serde_json::json!({"code": code});
            if let Some(object) = object {
                line["responseObject"] = object;
            }
            line.to_string()
        };
        let apply = |resource: &str, code| {
            let line: serde_json::Value =
                serde_json::from_str(&event(own, "patch", "", resource, "")).unwrap();
            with(line, code, None)
        };
        let role: serde_json::Value = serde_json::from_str(&event(
            own,
            "patch",
            "rbac.authorization.k8s.io",
            "roles",
            "",
        ))
        .unwrap();
        let rules = serde_json::json!({"kind": "Role", "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["kvc-leader"], "verbs": ["get", "update"]},
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
        ]});
        let lines = [
            // Created by apply: patch and create. Changed by apply: patch only.
            apply("services", 201),
            apply("serviceaccounts", 200),
            // A Role created by apply, and one only updated (its rules counted once).
            with(role.clone(), 201, Some(rules.clone())),
            with(role, 200, Some(rules)),
        ];
        std::fs::write(dir.path().join("p.audit.jsonl"), lines.join("\n")).unwrap();
        let mut roles = BTreeMap::new();
        roles.insert(
            ("Role".to_owned(), "warmcache-kvcache-operator".to_owned()),
            ("kvcache-operator".to_owned(), Scope::OwnNamespace),
        );
        let (uses, _, _) = read_uses(dir.path(), &roles).unwrap();
        let count = |group: &str, resource: &str, verb: &str| {
            uses.get(&(
                "kvcache-operator".to_owned(),
                Scope::OwnNamespace,
                group.to_owned(),
                resource.to_owned(),
                verb.to_owned(),
            ))
            .copied()
        };
        assert_eq!(count("", "services", "patch"), Some(1));
        assert_eq!(count("", "services", "create"), Some(1));
        assert_eq!(count("", "serviceaccounts", "patch"), Some(1));
        assert_eq!(count("", "serviceaccounts", "create"), None);
        let rbac = "rbac.authorization.k8s.io";
        assert_eq!(count(rbac, "roles", "patch"), Some(2));
        assert_eq!(count(rbac, "roles", "create"), Some(1));
        assert_eq!(count("coordination.k8s.io", "leases", "get"), Some(1));
        assert_eq!(count("coordination.k8s.io", "leases", "update"), Some(1));
        assert_eq!(uses.len(), 7, "{uses:?}");
    }

    #[test]
    fn one_unused_grant_fails_and_every_grant_used_passes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("p.audit.jsonl");
        // A request for every granted verb, allowed by the generated role of its scope.
        let mut every = Vec::new();
        for (component, permissions) in components() {
            let rendered = generated_roles(component, &permissions).unwrap();
            for p in &permissions {
                let role = |r: &Option<k8s_openapi::api::rbac::v1::Role>| {
                    r.as_ref().and_then(|r| r.metadata.name.clone()).unwrap()
                };
                let (kind, name) = match p.scope {
                    Scope::Cluster => (
                        "ClusterRole",
                        rendered
                            .cluster
                            .as_ref()
                            .and_then(|r| r.metadata.name.clone())
                            .unwrap(),
                    ),
                    Scope::OwnNamespace => ("Role", role(&rendered.own_namespace)),
                    Scope::ControlNamespace => ("Role", role(&rendered.control_namespace)),
                };
                let reason = format!(
                    r#"RBAC: allowed by RoleBinding "b" of {kind} "{name}" to ServiceAccount "x/y""#
                );
                let (resource, sub) = p.resource.split_once('/').unwrap_or((p.resource, ""));
                for verb in p.verbs {
                    every.push(event(&reason, verb, p.group, resource, sub));
                }
            }
        }
        std::fs::write(&log, every.join("\n")).unwrap();
        assert!(run(dir.path()).unwrap());
        // Without the last one, that grant is unused.
        every.pop();
        std::fs::write(&log, every.join("\n")).unwrap();
        assert!(!run(dir.path()).unwrap());
    }

    #[test]
    fn a_directory_without_logs_is_an_error_not_a_pass() {
        let dir = tempfile::tempdir().unwrap();
        assert!(run(dir.path()).is_err());
    }
}
