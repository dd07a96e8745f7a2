//! A container's environment as far as admission can know it, and Kubernetes `$(VAR)` expansion.
//!
//! Only literal `value`s are known. A variable set through `valueFrom` exists but its value is not
//! known at admission; `envFrom` may define any name, so a name absent from `env` is only "absent"
//! for the resolution rules (documented), never a known empty value for expansion.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Container;

/// What the environment says about one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val<'a> {
    /// Set with a literal value (after Kubernetes expansion of earlier variables).
    Known(Cow<'a, str>),
    /// Set, but from `valueFrom` (or from an expansion of such a variable): value unknown.
    Unknown {
        /// Field path of the entry, e.g. `spec.containers[0].env[3]`.
        field: String,
    },
    /// Not set in `env`.
    Absent,
}

#[derive(Debug, Clone)]
struct Entry<'a> {
    name: &'a str,
    /// `None`: set from `valueFrom` (or depends on such a variable).
    value: Option<Cow<'a, str>>,
    index: usize,
}

/// The `env` of one container.
#[derive(Debug, Clone)]
pub(crate) struct Env<'a> {
    entries: Vec<Entry<'a>>,
    path: &'a str,
    /// The container declares `envFrom`: names absent from `env` may still be set.
    pub(crate) has_env_from: bool,
}

impl<'a> Env<'a> {
    /// Build from a container; `path` is the container's field path (`spec.containers[0]`).
    pub(crate) fn of(c: &'a Container, path: &'a str) -> Env<'a> {
        let vars = c.env.as_deref().unwrap_or_default();
        let mut env = Env {
            entries: Vec::with_capacity(vars.len()),
            path,
            has_env_from: c.env_from.as_ref().is_some_and(|v| !v.is_empty()),
        };
        for (index, e) in vars.iter().enumerate() {
            let value = if e.value_from.is_some() {
                None
            } else {
                let raw = e.value.as_deref().unwrap_or_default();
                let (text, unknown) = expand_k8s(raw, |n| env.get(n));
                if unknown {
                    None
                } else {
                    Some(match text {
                        Cow::Borrowed(_) => Cow::Borrowed(raw),
                        Cow::Owned(s) => Cow::Owned(s),
                    })
                }
            };
            // Later entries with the same name win, as in the kubelet.
            if let Some(k) = env.entries.iter().position(|x| x.name == e.name) {
                env.entries.remove(k);
            }
            env.entries.push(Entry {
                name: &e.name,
                value,
                index,
            });
        }
        env
    }

    /// Look a variable up.
    pub(crate) fn get(&self, name: &str) -> Val<'_> {
        match self.entries.iter().rev().find(|e| e.name == name) {
            Some(Entry { value: Some(v), .. }) => Val::Known(Cow::Borrowed(v.as_ref())),
            Some(Entry { index, .. }) => Val::Unknown {
                field: format!("{}.env[{index}].valueFrom", self.path),
            },
            None => Val::Absent,
        }
    }
}

/// Kubernetes dependent-variable expansion of `command`, `args` and `env` values: `$(NAME)` is
/// replaced by NAME's value when NAME is set, `$$` is a literal `$`, anything else stays verbatim.
/// Returns the text and whether a referenced variable is set but its value unknown (the reference
/// is then kept verbatim in the text).
pub(crate) fn expand_k8s<'s, 'e>(
    s: &'s str,
    lookup: impl Fn(&str) -> Val<'e>,
) -> (Cow<'s, str>, bool) {
    if !s.contains('$') {
        return (Cow::Borrowed(s), false);
    }
    let mut out = String::with_capacity(s.len());
    let mut unknown = false;
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match lookup(name) {
                        Val::Known(v) => out.push_str(&v),
                        Val::Unknown { .. } => {
                            unknown = true;
                            out.push_str(&rest[i..i + 3 + end]);
                        }
                        Val::Absent => out.push_str(&rest[i..i + 3 + end]),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str(&rest[i..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    (Cow::Owned(out), unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};

    fn container(env: Vec<EnvVar>) -> Container {
        Container {
            name: "c".into(),
            env: Some(env),
            ..Default::default()
        }
    }

    fn lit(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    #[test]
    fn k8s_expansion_uses_earlier_values_and_escapes() {
        let c = container(vec![
            lit("ROOT", "/models"),
            lit("DEST", "$(ROOT)/llama"),
            lit("ESC", "$$(ROOT)"),
            lit("MISSING", "$(NOPE)/x"),
            EnvVar {
                name: "POD".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.name".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            lit("DEP", "/x/$(POD)"),
            lit("ROOT", "/override"),
        ]);
        let env = Env::of(&c, "spec.containers[0]");
        assert_eq!(env.get("DEST"), Val::Known("/models/llama".into()));
        assert_eq!(env.get("ESC"), Val::Known("$(ROOT)".into()));
        assert_eq!(env.get("MISSING"), Val::Known("$(NOPE)/x".into()));
        assert_eq!(env.get("ROOT"), Val::Known("/override".into()));
        assert!(
            matches!(env.get("POD"), Val::Unknown { field } if field == "spec.containers[0].env[4].valueFrom")
        );
        assert!(matches!(env.get("DEP"), Val::Unknown { .. }));
        assert_eq!(env.get("OTHER"), Val::Absent);
    }

    #[test]
    fn unterminated_reference_is_literal() {
        let (t, u) = expand_k8s("a$(B", |_| Val::Absent);
        assert_eq!((t.as_ref(), u), ("a$(B", false));
        let (t, u) = expand_k8s("$x$", |_| Val::Absent);
        assert_eq!((t.as_ref(), u), ("$x$", false));
    }
}
