//! A container's environment as far as admission can know it, and Kubernetes `$(VAR)` expansion.
//!
//! Only literal `value`s are known. A variable set through `valueFrom` exists but its value is not
//! known at admission; `envFrom` may define any name, so a name absent from `env` is only "absent"
//! for the resolution rules (documented), never a known empty value for expansion.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use crate::limits::Meter;

/// What the environment says about one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val<'a> {
    /// Set with a literal value (after Kubernetes expansion of earlier variables).
    Known(Cow<'a, str>),
    /// Set, but from `valueFrom` (or from an expansion of such a variable, or past an expansion
    /// bound): value unknown.
    Unknown {
        /// Field path of the entry, e.g. `spec.containers[0].env[3].valueFrom`.
        field: String,
    },
    /// Not set in `env`.
    Absent,
}

#[derive(Debug, Clone)]
struct Entry<'a> {
    /// `None`: set from `valueFrom` (or depends on such a variable, or past a bound).
    value: Option<Cow<'a, str>>,
    index: usize,
    /// The value is unknown because an expansion bound was hit.
    over_bound: bool,
}

/// The `env` of one container.
#[derive(Debug, Clone)]
pub(crate) struct Env<'a> {
    /// By name; a later entry of the same name replaces an earlier one, as in the kubelet.
    entries: BTreeMap<&'a str, Entry<'a>>,
    path: &'a str,
    /// The container declares `envFrom`: names absent from `env` may still be set.
    pub(crate) has_env_from: bool,
}

impl<'a> Env<'a> {
    /// Build from a container; `path` is the container's field path (`spec.containers[0]`).
    /// Expansions are charged to `meter`; a value past a bound is unknown.
    pub(crate) fn of(c: &'a Container, path: &'a str, meter: &Meter<'_>) -> Env<'a> {
        let vars = c.env.as_deref().unwrap_or_default();
        let mut env = Env {
            entries: BTreeMap::new(),
            path,
            has_env_from: c.env_from.as_ref().is_some_and(|v| !v.is_empty()),
        };
        for (index, e) in vars.iter().enumerate() {
            let mut over_bound = false;
            let value = if e.value_from.is_some() {
                None
            } else {
                let raw = e.value.as_deref().unwrap_or_default();
                meter.at(Some(index));
                let before = meter.hit();
                // Only the entries before this one are in `env` yet: `$(VAR)` refers to
                // variables defined earlier in the list (and to `envFrom`), as in the kubelet.
                let (text, unknown) = expand_k8s(raw, |n| env.lookup_for_expansion(n), meter);
                over_bound = before.is_none() && meter.hit().is_some();
                meter.at(None);
                if unknown {
                    None
                } else {
                    Some(match text {
                        Cow::Borrowed(_) => Cow::Borrowed(raw),
                        Cow::Owned(s) => Cow::Owned(s),
                    })
                }
            };
            env.entries.insert(
                &e.name,
                Entry {
                    value,
                    index,
                    over_bound,
                },
            );
        }
        env
    }

    /// A name as `$(NAME)` in an env value, a command or args sees it: a name absent from
    /// `env` may be set by `envFrom`, so it is unknown when the container has `envFrom`.
    pub(crate) fn lookup_for_expansion(&self, name: &str) -> Val<'_> {
        match self.get(name) {
            Val::Absent if self.has_env_from => Val::Unknown {
                field: format!("{}.envFrom", self.path),
            },
            v => v,
        }
    }

    /// Look a variable up.
    pub(crate) fn get(&self, name: &str) -> Val<'_> {
        match self.entries.get(name) {
            Some(Entry { value: Some(v), .. }) => Val::Known(Cow::Borrowed(v.as_ref())),
            Some(Entry {
                index, over_bound, ..
            }) => Val::Unknown {
                field: if *over_bound {
                    format!("{}.env[{index}].value", self.path)
                } else {
                    format!("{}.env[{index}].valueFrom", self.path)
                },
            },
            None => Val::Absent,
        }
    }
}

/// Kubernetes dependent-variable expansion of `command`, `args` and `env` values, exactly as the
/// kubelet's `expansion.Expand` reads them: `$(NAME)` is replaced by NAME's value when NAME is
/// set, `$$` is a literal `$`, an unterminated `$(` and a `$` before anything else stay verbatim.
/// Returns the text and whether it is unknown: a referenced variable is set but its value unknown
/// (the reference is then kept verbatim in the text), or the expansion passes a bound of `meter`
/// (the text is then `s` as written, never a truncated value).
pub(crate) fn expand_k8s<'s, 'e>(
    s: &'s str,
    lookup: impl Fn(&str) -> Val<'e>,
    meter: &Meter<'_>,
) -> (Cow<'s, str>, bool) {
    if !s.contains('$') {
        return (Cow::Borrowed(s), false);
    }
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut unknown = false;
    // Bytes of `s` before `checkpoint` are in `out`; `cursor` is the byte looked at. Both only
    // move forward, so the work is linear in `s` plus the bytes inserted.
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < b.len() {
        if b[cursor] != b'$' || cursor + 1 >= b.len() {
            cursor += 1;
            continue;
        }
        out.push_str(&s[checkpoint..cursor]);
        match b[cursor + 1] {
            b'$' => {
                out.push('$');
                cursor += 2;
            }
            b'(' => match s[cursor + 2..].find(')') {
                Some(k) => {
                    let reference = &s[cursor..cursor + 3 + k];
                    match lookup(&s[cursor + 2..cursor + 2 + k]) {
                        Val::Known(v) => {
                            if !meter.expand(out.len() + v.len(), v.len()) {
                                return (Cow::Borrowed(s), true);
                            }
                            out.push_str(&v);
                        }
                        Val::Unknown { .. } => {
                            unknown = true;
                            out.push_str(reference);
                        }
                        Val::Absent => out.push_str(reference),
                    }
                    cursor += 3 + k;
                }
                None => {
                    // The kubelet writes "$(" and goes on reading after it.
                    out.push_str("$(");
                    cursor += 2;
                }
            },
            _ => {
                // "$" and the character after it are kept; that character is copied with the
                // text that follows (it is neither '$' nor '(').
                out.push('$');
                cursor += 1;
            }
        }
        checkpoint = cursor;
    }
    out.push_str(&s[checkpoint..]);
    (Cow::Owned(out), unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Bound, Budget, MAX_EXPANSION_BYTES};
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
        let budget = Budget::default();
        let meter = Meter::new(&budget);
        let env = Env::of(&c, "spec.containers[0]", &meter);
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

    fn expand(s: &str) -> (String, bool) {
        let budget = Budget::default();
        let meter = Meter::new(&budget);
        let (t, u) = expand_k8s(
            s,
            |n| match n {
                "A" => Val::Known("a".into()),
                "U" => Val::Unknown {
                    field: String::new(),
                },
                _ => Val::Absent,
            },
            &meter,
        );
        (t.into_owned(), u)
    }

    #[test]
    fn unterminated_reference_is_literal() {
        assert_eq!(expand("a$(B"), ("a$(B".into(), false));
        assert_eq!(expand("$x$"), ("$x$".into(), false));
    }

    #[test]
    fn expansion_reads_as_the_kubelet_does() {
        // After an unterminated "$(", the kubelet keeps reading: `$$` still escapes, and a
        // later complete reference still expands.
        assert_eq!(expand("$(a$$"), ("$(a$".into(), false));
        assert_eq!(expand("$($(A)"), ("$($(A)".into(), false));
        assert_eq!(expand("$(A$(A)"), ("$(A$(A)".into(), false));
        assert_eq!(expand("x$(A)y$$(A)z$"), ("xay$(A)z$".into(), false));
        assert_eq!(expand("$é$(A)"), ("$éa".into(), false));
        assert_eq!(expand("$$$(A)"), ("$a".into(), false));
        assert_eq!(expand("$(U)/$(A)"), ("$(U)/a".into(), true));
        assert_eq!(expand("$()"), ("$()".into(), false));
    }

    #[test]
    fn env_from_makes_absent_references_unknown() {
        let mut c = container(vec![lit("HF_HOME", "$(BASE)/hf"), lit("X", "$$(BASE)")]);
        c.env_from = Some(vec![Default::default()]);
        let budget = Budget::default();
        let meter = Meter::new(&budget);
        let env = Env::of(&c, "spec.containers[0]", &meter);
        assert!(matches!(env.get("HF_HOME"), Val::Unknown { .. }));
        assert_eq!(env.get("X"), Val::Known("$(BASE)".into()));
    }

    #[test]
    fn doubling_chain_is_unknown_past_the_bound() {
        let mut vars = vec![lit("V0", "xx")];
        for k in 1..=40 {
            vars.push(lit(
                &format!("V{k}"),
                &format!("$(V{})$(V{})", k - 1, k - 1),
            ));
        }
        let c = container(vars);
        let budget = Budget::default();
        let meter = Meter::new(&budget);
        let env = Env::of(&c, "spec.containers[0]", &meter);
        assert_eq!(
            env.get("V19"),
            Val::Known("x".repeat(1 << 20).into()),
            "2^20 bytes is exactly the bound"
        );
        assert!(
            matches!(env.get("V20"), Val::Unknown { field } if field == "spec.containers[0].env[20].value")
        );
        assert!(matches!(env.get("V40"), Val::Unknown { .. }));
        assert_eq!(meter.hit(), Some((Bound::ValueBytes, Some(20))));
        assert!(budget.expanded() <= MAX_EXPANSION_BYTES);
    }
}
