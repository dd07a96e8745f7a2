//! Names of the rendered objects, their labels, and the Kubernetes name grammars the validator
//! checks against.

use std::collections::BTreeMap;

/// `app.kubernetes.io/name` of every rendered object.
pub const APP_NAME: &str = "kv-cache-backend";
/// `app.kubernetes.io/part-of` of every rendered object (not part of any selector).
pub const PART_OF: &str = "gpustack-operator-worker";
/// Label keys.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Label key naming the backend.
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// Label key naming the part of the backend (`leader`, `member-<i>`).
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Label key naming the product.
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
/// Annotation on a member Pod template: SHA-256 of the template without its nodeSelector. The
/// controller deletes member Pods whose value differs (the DaemonSets use `OnDelete`).
pub const POD_SPEC_HASH_ANNOTATION: &str = "kvcache.gpustack.ai/pod-spec-hash";

/// Name of the leader Deployment and Service.
pub fn leader_name(backend: &str) -> String {
    format!("{backend}-leader")
}

/// Name of the member DaemonSet of the group at `index`.
pub fn member_name(backend: &str, index: usize) -> String {
    format!("{backend}-member-{index}")
}

/// `app.kubernetes.io/component` of the group at `index`.
pub fn member_component(index: usize) -> String {
    format!("member-{index}")
}

/// `app.kubernetes.io/component` of the leader.
pub const LEADER_COMPONENT: &str = "leader";

/// `app.kubernetes.io/component` of the members' ServiceAccount, Role and RoleBinding, which
/// every group shares.
pub const MEMBER_ACCESS_COMPONENT: &str = "member";

/// Name of the members' ServiceAccount, Role and RoleBinding (HA with Lease addressing only).
/// Shorter than every `<backend>-member-<index>`, so the object-name rule covers it.
pub fn member_access_name(backend: &str) -> String {
    format!("{backend}-member")
}

/// The selector labels of one part of a backend (name, instance, component).
pub fn selector_labels(backend: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_owned(), APP_NAME.to_owned()),
        (LABEL_INSTANCE.to_owned(), backend.to_owned()),
        (LABEL_COMPONENT.to_owned(), component.to_owned()),
    ])
}

/// The labels of one part of a backend: the selector labels plus `part-of`.
pub fn labels(backend: &str, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(backend, component);
    labels.insert(LABEL_PART_OF.to_owned(), PART_OF.to_owned());
    labels
}

fn is_lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// Why `value` is not a DNS-1035 label (lower-case letters, digits and `-`, starting with a
/// letter, ending with a letter or digit, at most 63 characters), or `None` when it is one.
pub fn dns1035_label_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("it is empty".into());
    }
    if value.len() > 63 {
        return Some(format!(
            "it is {} characters long, and at most 63 are allowed",
            value.len()
        ));
    }
    if !value.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
        return Some("it must start with a lower-case letter".into());
    }
    if !value.chars().last().is_some_and(is_lower_alnum) {
        return Some("it must end with a lower-case letter or a digit".into());
    }
    if let Some(c) = value.chars().find(|c| !is_lower_alnum(*c) && *c != '-') {
        return Some(format!(
            "it contains {c:?}; only lower-case letters, digits and '-' are allowed"
        ));
    }
    None
}

/// Why `value` is not a DNS-1123 label, or `None` when it is one.
pub fn dns1123_label_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("it is empty".into());
    }
    if value.len() > 63 {
        return Some(format!(
            "it is {} characters long, and at most 63 are allowed",
            value.len()
        ));
    }
    if !value.chars().next().is_some_and(is_lower_alnum)
        || !value.chars().last().is_some_and(is_lower_alnum)
    {
        return Some("it must start and end with a lower-case letter or a digit".into());
    }
    if let Some(c) = value.chars().find(|c| !is_lower_alnum(*c) && *c != '-') {
        return Some(format!(
            "it contains {c:?}; only lower-case letters, digits and '-' are allowed"
        ));
    }
    None
}

/// Why `value` is not a DNS-1123 subdomain (dot-separated DNS-1123 labels, at most 253
/// characters), or `None` when it is one.
pub fn dns1123_subdomain_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("it is empty".into());
    }
    if value.len() > 253 {
        return Some(format!(
            "it is {} characters long, and at most 253 are allowed",
            value.len()
        ));
    }
    value
        .split('.')
        .find_map(|part| dns1123_label_problem(part).map(|p| format!("{part:?}: {p}")))
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// Why `value` is not a label value (empty, or at most 63 characters of letters, digits, `-`,
/// `_`, `.`, starting and ending with a letter or digit), or `None` when it is one.
pub fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    if value.len() > 63 {
        return Some(format!(
            "it is {} characters long, and at most 63 are allowed",
            value.len()
        ));
    }
    if !value.chars().next().is_some_and(is_alnum) || !value.chars().last().is_some_and(is_alnum) {
        return Some("it must start and end with a letter or a digit".into());
    }
    if let Some(c) = value
        .chars()
        .find(|c| !is_alnum(*c) && !matches!(c, '-' | '_' | '.'))
    {
        return Some(format!(
            "it contains {c:?}; only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    None
}

/// Why `value` is not a label key (an optional DNS-1123 subdomain prefix and `/`, then a name of
/// at most 63 characters as for a label value, but not empty), or `None` when it is one.
pub fn label_key_problem(value: &str) -> Option<String> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if let Some(prefix) = prefix
        && let Some(problem) = dns1123_subdomain_problem(prefix)
    {
        return Some(format!(
            "its prefix {prefix:?} is not a DNS subdomain: {problem}"
        ));
    }
    if name.is_empty() {
        return Some("its name part is empty".into());
    }
    if name.contains('/') {
        return Some("it contains more than one '/'".into());
    }
    label_value_problem(name).map(|p| format!("its name part {name:?} is invalid: {p}"))
}

/// Why `value` is not an environment variable name by Kubernetes' `IsEnvVarName` (the rule
/// every API server version applies, and upstream's admission uses): letters, digits, `_`, `-`
/// and `.`, not starting with a digit, and neither `.`, `..` nor starting with `..`. Or `None`.
pub fn env_name_problem(value: &str) -> Option<String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if value.is_empty()
        || value.chars().next().is_some_and(|c| c.is_ascii_digit())
        || !value.chars().all(allowed)
    {
        return Some(
            "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', \
             or '.', and must not start with a digit"
                .into(),
        );
    }
    match value {
        "." => Some("must not be '.'".into()),
        ".." => Some("must not be '..'".into()),
        v if v.starts_with("..") => Some("must not start with '..'".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1035() {
        assert_eq!(dns1035_label_problem("kvc-leader"), None);
        assert!(dns1035_label_problem("1kvc").is_some());
        assert!(dns1035_label_problem("kvc.x").is_some());
        assert!(dns1035_label_problem(&"a".repeat(64)).is_some());
        assert_eq!(dns1035_label_problem(&"a".repeat(63)), None);
        assert!(dns1035_label_problem("kvc-").is_some());
    }

    #[test]
    fn label_keys_and_values() {
        assert_eq!(label_key_problem("kvcache"), None);
        assert_eq!(label_key_problem("node.kubernetes.io/instance-type"), None);
        assert!(label_key_problem("a/b/c").is_some());
        assert!(label_key_problem("Bad_Prefix/x").is_some());
        assert!(label_key_problem("/x").is_some());
        assert!(label_key_problem("x/").is_some());
        assert_eq!(label_value_problem(""), None);
        assert_eq!(label_value_problem("true"), None);
        assert!(label_value_problem("a b").is_some());
        assert!(label_value_problem("-a").is_some());
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name_problem("MY_VAR_1"), None);
        assert_eq!(env_name_problem("_x"), None);
        assert!(env_name_problem("1X").is_some());
        // Kubernetes' rule allows '-' and '.'.
        assert_eq!(env_name_problem("A-B"), None);
        assert_eq!(env_name_problem("my.env-name"), None);
        assert_eq!(env_name_problem(".x"), None);
        assert_eq!(env_name_problem("-x"), None);
        for bad in ["", ".", "..", "..x", "A B", "A=B", "A\u{200b}B", "ÄB"] {
            assert!(env_name_problem(bad).is_some(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn labels_carry_part_of_but_selectors_do_not() {
        let selector = selector_labels("kvc", "leader");
        assert_eq!(selector.len(), 3);
        let all = labels("kvc", "leader");
        assert_eq!(all.get(LABEL_PART_OF).map(String::as_str), Some(PART_OF));
        assert!(selector.iter().all(|(k, v)| all.get(k) == Some(v)));
    }
}
