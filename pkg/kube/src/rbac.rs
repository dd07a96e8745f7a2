//! Least-privilege RBAC generated from code.
//!
//! Each component keeps the list of API calls it makes next to the code that makes them (a
//! `rbac.rs` in its crate, one [`Permission`] per call site family, each saying why). `cargo
//! xtask gen` renders the lists into the chart's ClusterRoles and Roles (`charts/warmcache/
//! files/rbac/`), so the chart grants exactly what the code declares; [`check`] refuses a list
//! with wildcards, unknown or escalating verbs, or duplicates before anything is rendered.
//!
//! A permission applies at one [`Scope`]: cluster-wide (a ClusterRole, for cluster-scoped
//! resources and for namespaced ones read or written in any namespace), the component's own
//! namespace (the release namespace: its leader-election Lease, its catalog ConfigMap) or the
//! control namespace (`nvca-modelcache-init`: bindings and primary claims), each a Role there.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::ObjectMeta;

use crate::apply::{COMPONENT_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// Where a permission applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Cluster-scoped resources, or namespaced ones in every namespace: the component's
    /// ClusterRole, bound by a ClusterRoleBinding.
    Cluster,
    /// The namespace the component runs in (the release namespace): a Role there.
    OwnNamespace,
    /// The control namespace (`nvca-modelcache-init` by default): a Role there.
    ControlNamespace,
}

impl Scope {
    /// Every scope, in rendering order.
    pub const ALL: [Scope; 3] = [Scope::Cluster, Scope::OwnNamespace, Scope::ControlNamespace];

    /// The suffix of the generated file (and the role's kind) for this scope.
    pub fn file_suffix(self) -> &'static str {
        match self {
            Scope::Cluster => "clusterrole",
            Scope::OwnNamespace => "role",
            Scope::ControlNamespace => "control-role",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Cluster => "cluster",
            Scope::OwnNamespace => "own namespace",
            Scope::ControlNamespace => "control namespace",
        })
    }
}

/// One family of API calls a component makes: verbs on one resource (or subresource, e.g.
/// `pods/status`) of one API group, at one scope, optionally only on named objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permission {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Resource, plural, optionally `/subresource`.
    pub resource: &'static str,
    /// Verbs the code uses.
    pub verbs: &'static [&'static str],
    /// Where the calls are made.
    pub scope: Scope,
    /// `resourceNames` (empty: every object). Only for verbs naming an object (a `list` or
    /// `watch` is authorized by name when it selects `metadata.name`).
    pub names: &'static [&'static str],
    /// Which code path makes the calls, for the reviewer of the generated role.
    pub why: &'static str,
}

/// Verbs a permission may name. `*`, `bind`, `escalate` and `impersonate` never: no
/// component needs them, and each one is a privilege escalation.
pub const VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// Verbs that may be restricted by `resourceNames`. `create` and `deletecollection` cannot
/// be (the API server does not know the name when it authorizes them).
const NAMED_VERBS: [&str; 6] = ["get", "list", "watch", "update", "patch", "delete"];

/// A permission list that cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RbacError {
    #[error("{component}: permission {index} ({resource}): {problem}")]
    Invalid {
        component: String,
        index: usize,
        resource: String,
        problem: String,
    },
}

/// Checks a component's permissions: known verbs only (never a wildcard), no empty lists,
/// `resourceNames` only with verbs that can be authorized by name, no wildcard resource or
/// group, and no verb declared twice for the same resource, scope and names.
pub fn check(component: &str, permissions: &[Permission]) -> Result<(), RbacError> {
    // (scope, group, resource, sorted names, verb) -> the permission granting it
    type Grant<'a> = (Scope, &'a str, &'a str, Vec<&'a str>, &'a str);
    let mut seen: BTreeMap<Grant<'_>, usize> = BTreeMap::new();
    for (index, p) in permissions.iter().enumerate() {
        let invalid = |problem: String| RbacError::Invalid {
            component: component.to_owned(),
            index,
            resource: display_resource(p),
            problem,
        };
        if p.resource.is_empty() || p.resource.contains('*') || p.group.contains('*') {
            return Err(invalid(
                "the resource and group must be named (no wildcard)".to_owned(),
            ));
        }
        if p.verbs.is_empty() {
            return Err(invalid("no verbs".to_owned()));
        }
        if p.why.trim().is_empty() {
            return Err(invalid("says no reason (why)".to_owned()));
        }
        for verb in p.verbs {
            if !VERBS.contains(verb) {
                return Err(invalid(format!(
                    "verb {verb:?} is not one of {}",
                    VERBS.join(", ")
                )));
            }
            if !p.names.is_empty() && !NAMED_VERBS.contains(verb) {
                return Err(invalid(format!(
                    "verb {verb:?} cannot be restricted by resourceNames"
                )));
            }
            let mut names: Vec<&str> = p.names.to_vec();
            names.sort_unstable();
            if let Some(first) = seen.insert((p.scope, p.group, p.resource, names, verb), index) {
                return Err(invalid(format!(
                    "verb {verb:?} is already granted by permission {first}"
                )));
            }
        }
        if p.names.iter().any(|n| n.is_empty() || n.contains('*')) {
            return Err(invalid("resourceNames must be exact names".to_owned()));
        }
    }
    Ok(())
}

fn display_resource(p: &Permission) -> String {
    if p.group.is_empty() {
        p.resource.to_owned()
    } else {
        format!("{}.{}", p.resource, p.group)
    }
}

/// The policy rules of one scope: one rule per (group, names) and verb set, resources merged,
/// everything sorted so the output is stable.
pub fn rules(permissions: &[Permission], scope: Scope) -> Vec<PolicyRule> {
    // (group, names) -> resource -> verbs
    type Verbs<'a> = BTreeMap<&'a str, Vec<&'a str>>;
    let mut by_target: BTreeMap<(&str, Vec<&str>), Verbs<'_>> = BTreeMap::new();
    for p in permissions.iter().filter(|p| p.scope == scope) {
        let mut names = p.names.to_vec();
        names.sort_unstable();
        let verbs = by_target
            .entry((p.group, names))
            .or_default()
            .entry(p.resource)
            .or_default();
        verbs.extend(p.verbs.iter().copied());
    }
    let mut out = Vec::new();
    for ((group, names), resources) in by_target {
        // Resources with the same verb set share a rule.
        let mut by_verbs: BTreeMap<Vec<&str>, Vec<&str>> = BTreeMap::new();
        for (resource, mut verbs) in resources {
            verbs.sort_by_key(|v| VERBS.iter().position(|k| k == v));
            verbs.dedup();
            by_verbs.entry(verbs).or_default().push(resource);
        }
        for (verbs, resources) in by_verbs {
            out.push(PolicyRule {
                api_groups: Some(vec![group.to_owned()]),
                resources: Some(resources.into_iter().map(str::to_owned).collect()),
                resource_names: (!names.is_empty())
                    .then(|| names.iter().map(|n| (*n).to_owned()).collect()),
                verbs: verbs.into_iter().map(str::to_owned).collect(),
                non_resource_urls: None,
            });
        }
    }
    out
}

/// The name of a component's role at `scope` (and of its binding): `warmcache-<component>`,
/// with `-control` for the control namespace's, so the two Roles stay apart when the control
/// namespace is also the component's own.
pub fn role_name(component: &str, scope: Scope) -> String {
    match scope {
        Scope::ControlNamespace => format!("{MANAGED_BY_VALUE}-{component}-control"),
        Scope::Cluster | Scope::OwnNamespace => format!("{MANAGED_BY_VALUE}-{component}"),
    }
}

fn metadata(component: &str, scope: Scope, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(role_name(component, scope)),
        namespace: namespace.map(str::to_owned),
        labels: Some(
            [
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
                (COMPONENT_LABEL.to_owned(), component.to_owned()),
            ]
            .into(),
        ),
        ..ObjectMeta::default()
    }
}

/// A component's roles, one per scope it uses: the ClusterRole, and Roles in `own_namespace`
/// and `control_namespace`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Roles {
    pub cluster: Option<ClusterRole>,
    pub own_namespace: Option<Role>,
    pub control_namespace: Option<Role>,
}

/// Renders a component's roles after [`check`]ing its permissions.
pub fn roles(
    component: &str,
    permissions: &[Permission],
    own_namespace: &str,
    control_namespace: &str,
) -> Result<Roles, RbacError> {
    check(component, permissions)?;
    let role = |scope: Scope, namespace: &str| {
        let rules = rules(permissions, scope);
        (!rules.is_empty()).then(|| Role {
            metadata: metadata(component, scope, Some(namespace)),
            rules: Some(rules),
        })
    };
    let cluster_rules = rules(permissions, Scope::Cluster);
    Ok(Roles {
        cluster: (!cluster_rules.is_empty()).then(|| ClusterRole {
            metadata: metadata(component, Scope::Cluster, None),
            rules: Some(cluster_rules),
            aggregation_rule: None,
        }),
        own_namespace: role(Scope::OwnNamespace, own_namespace),
        control_namespace: role(Scope::ControlNamespace, control_namespace),
    })
}

/// What the runtime's leader election calls on its Lease `lease` (the component's name unless
/// `--leader-election-lease` says otherwise) in its own namespace: every leader-elected component
/// adds these to its list. `get` and `update` name the Lease, so a component cannot rewrite
/// another's election; `create` cannot be restricted by name.
pub const fn leader_election(lease: &'static [&'static str]) -> [Permission; 2] {
    [
        Permission {
            group: "coordination.k8s.io",
            resource: "leases",
            verbs: &["get", "update"],
            scope: Scope::OwnNamespace,
            names: lease,
            why: "leader election: read and renew the component's Lease (pkg/kube leader.rs)",
        },
        Permission {
            group: "coordination.k8s.io",
            resource: "leases",
            verbs: &["create"],
            scope: Scope::OwnNamespace,
            names: &[],
            why: "leader election: create the component's Lease when it does not exist",
        },
    ]
}

/// What [`EventRecorder`](crate::EventRecorder) calls: every component that records Events
/// adds this at the scope of the objects it reports on.
pub const fn events(scope: Scope) -> Permission {
    Permission {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        scope,
        names: &[],
        why: "Events on the objects the component acts on (pkg/kube events.rs: create, then patch the series)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn p(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
        scope: Scope,
    ) -> Permission {
        Permission {
            group,
            resource,
            verbs,
            scope,
            names: &[],
            why: "test",
        }
    }

    #[test]
    fn wildcards_unknown_verbs_and_escalation_are_refused() {
        for bad in [
            p("", "pods", &["*"], Scope::Cluster),
            p("", "*", &["get"], Scope::Cluster),
            p("*", "pods", &["get"], Scope::Cluster),
            p("", "pods", &["escalate"], Scope::Cluster),
            p("", "pods", &["impersonate"], Scope::Cluster),
            p("", "pods", &[], Scope::Cluster),
            p("", "", &["get"], Scope::Cluster),
        ] {
            let err = check("c", &[bad]).unwrap_err();
            assert!(err.to_string().starts_with("c: permission 0"), "{err}");
        }
    }

    #[test]
    fn a_verb_granted_twice_names_both_permissions() {
        let list = [
            p("", "pods", &["get", "list"], Scope::Cluster),
            p("", "pods", &["watch", "get"], Scope::Cluster),
        ];
        let err = check("c", &list).unwrap_err().to_string();
        assert!(
            err.contains("permission 1") && err.contains("permission 0"),
            "{err}"
        );
        // The same verb at another scope is another grant.
        let list = [
            p("", "pods", &["get"], Scope::Cluster),
            p("", "pods", &["get"], Scope::OwnNamespace),
        ];
        check("c", &list).unwrap();
    }

    #[test]
    fn resource_names_only_with_verbs_that_name_an_object() {
        let mut named = p("", "configmaps", &["create"], Scope::OwnNamespace);
        named.names = &["catalog"];
        let err = check("c", &[named]).unwrap_err().to_string();
        assert!(err.contains("\"create\" cannot be restricted"), "{err}");
        named.verbs = &["get", "list", "watch"];
        check("c", &[named]).unwrap();
        named.names = &[""];
        assert!(check("c", &[named]).is_err());
    }

    #[test]
    fn a_reason_is_required() {
        let mut silent = p("", "pods", &["get"], Scope::Cluster);
        silent.why = " ";
        assert!(
            check("c", &[silent])
                .unwrap_err()
                .to_string()
                .contains("why")
        );
    }

    #[test]
    fn rules_merge_resources_with_the_same_verbs_and_keep_names_apart() {
        let mut catalog = p("", "configmaps", &["list", "watch"], Scope::OwnNamespace);
        catalog.names = &["nvcf-storage-capabilities"];
        let list = [
            p("", "pods", &["watch", "list", "get"], Scope::Cluster),
            p("", "namespaces", &["get", "list", "watch"], Scope::Cluster),
            p("", "pods", &["delete"], Scope::Cluster),
            p(
                "storage.k8s.io",
                "csidrivers",
                &["list", "watch"],
                Scope::Cluster,
            ),
            catalog,
            p("", "configmaps", &["get"], Scope::OwnNamespace),
        ];
        let cluster = rules(&list, Scope::Cluster);
        let summary: Vec<String> = cluster
            .iter()
            .map(|r| {
                format!(
                    "{:?} {:?} {:?}",
                    r.api_groups.as_deref().unwrap_or_default(),
                    r.resources.as_deref().unwrap_or_default(),
                    r.verbs
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                r#"[""] ["namespaces"] ["get", "list", "watch"]"#,
                r#"[""] ["pods"] ["get", "list", "watch", "delete"]"#,
                r#"["storage.k8s.io"] ["csidrivers"] ["list", "watch"]"#,
            ]
        );
        let own = rules(&list, Scope::OwnNamespace);
        assert_eq!(own.len(), 2);
        assert_eq!(own[0].resource_names, None);
        assert_eq!(own[0].verbs, ["get"]);
        assert_eq!(
            own[1].resource_names.as_deref(),
            Some(&["nvcf-storage-capabilities".to_owned()][..])
        );
        assert!(rules(&list, Scope::ControlNamespace).is_empty());
    }

    #[test]
    fn roles_exist_only_for_the_scopes_used_and_are_labelled() {
        let list = [p("", "pods", &["get"], Scope::ControlNamespace)];
        let roles = roles("binding-controller", &list, "warmcache-system", "ctl").unwrap();
        assert!(roles.cluster.is_none() && roles.own_namespace.is_none());
        let control = roles.control_namespace.unwrap();
        assert_eq!(
            control.metadata.name.as_deref(),
            Some("warmcache-binding-controller-control")
        );
        assert_eq!(control.metadata.namespace.as_deref(), Some("ctl"));
        let labels = control.metadata.labels.unwrap();
        assert_eq!(labels[COMPONENT_LABEL], "binding-controller");
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY_VALUE);
    }

    #[test]
    fn the_shared_lists_pass_the_check() {
        let mut list = leader_election(&["component"]).to_vec();
        list.push(events(Scope::Cluster));
        check("shared", &list).unwrap();
    }
}
