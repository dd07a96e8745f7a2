//! A container's words and env, read conservatively for the safety checks.
//!
//! Identity and landing come from `warmcache_modelid`, which reads a container as a shell does.
//! The checks here only ask whether an option or an assignment *appears* (another repository,
//! a cache variable set by a script), so they read every word of `command` and `args`, splitting
//! shell strings on unquoted blanks and operators: a word that appears anywhere counts, which
//! can only make the rewrite more careful, never less.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Container;

/// Shell operators that end a command; kept as words of their own so an option before one has
/// no value.
const OPERATORS: [char; 5] = [';', '&', '|', '(', ')'];

fn is_operator_word(w: &str) -> bool {
    !w.is_empty() && w.chars().all(|c| OPERATORS.contains(&c) || c == '\n')
}

/// Split a shell string into words: blanks separate, `'...'` is literal, `"..."` keeps blanks
/// (a backslash escapes `"`, `\`, `$` and a backquote inside), a backslash escapes the next
/// character outside quotes; operators and newlines are words of their own.
pub(crate) fn split_shell(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => match chars.peek() {
                            Some(&n @ ('"' | '\\' | '$' | '`')) => {
                                cur.push(n);
                                chars.next();
                            }
                            _ => cur.push('\\'),
                        },
                        q => cur.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next()
                    && n != '\n'
                {
                    cur.push(n);
                }
            }
            c if c == '\n' || OPERATORS.contains(&c) => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
                out.push(c.to_string());
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// The elements of `c`'s `command` and `args`, as given.
fn argv(c: &Container) -> impl Iterator<Item = &str> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
}

/// Every word of `c`'s `command` and `args`. An element holding blanks, quotes or operators is
/// a shell string and is split; an element that looks like JSON (`{...}`, `[...]`) is one word,
/// as the program receives it. An element that is one word as given is borrowed, not copied:
/// the admission reads the words of a container several times per pod.
pub(crate) fn container_words(c: &Container) -> Vec<Cow<'_, str>> {
    let elements = c.command.iter().flatten().chain(c.args.iter().flatten());
    let mut out = Vec::with_capacity(elements.clone().count());
    for e in elements {
        let t = e.trim_start();
        if t.starts_with('{') || t.starts_with('[') {
            out.push(Cow::Borrowed(e.as_str()));
        } else if e.chars().any(|ch| {
            ch.is_whitespace() || matches!(ch, '\'' | '"' | '\\') || OPERATORS.contains(&ch)
        }) {
            out.extend(split_shell(e).into_iter().map(Cow::Owned));
        } else {
            out.push(Cow::Borrowed(e.as_str()));
        }
    }
    out
}

/// The values of every `--name value` / `--name=value` among `names`. A name followed by
/// another option, an operator or nothing has no value and gives `None`.
pub(crate) fn flag_values<W: AsRef<str>>(words: &[W], names: &[&str]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(w) = words.get(i).map(AsRef::as_ref) {
        i += 1;
        if let Some((n, v)) = w.split_once('=')
            && names.contains(&n)
        {
            out.push(Some(v.to_owned()));
            continue;
        }
        if names.contains(&w) {
            match words.get(i).map(AsRef::as_ref) {
                Some(v) if !v.starts_with('-') && !is_operator_word(v) => {
                    out.push(Some(v.to_owned()));
                    i += 1;
                }
                _ => out.push(None),
            }
        }
    }
    out
}

/// The values after each `--name` (or `--name=first`) up to the next option or operator: list
/// options such as vLLM's `--lora-modules a=x b=y`.
pub(crate) fn flag_lists<W: AsRef<str>>(words: &[W], names: &[&str]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(w) = words.get(i).map(AsRef::as_ref) {
        i += 1;
        let mut list = Vec::new();
        if let Some((n, v)) = w.split_once('=')
            && names.contains(&n)
        {
            list.push(v.to_owned());
        } else if !names.contains(&w) {
            continue;
        }
        while let Some(v) = words.get(i).map(AsRef::as_ref) {
            if v.starts_with('-') || is_operator_word(v) {
                break;
            }
            list.push(v.to_owned());
            i += 1;
        }
        out.push(list);
    }
    out
}

/// Whether any of `names` appears as an option (alone or as `--name=...`).
pub(crate) fn has_flag<W: AsRef<str>>(words: &[W], names: &[&str]) -> bool {
    words.iter().any(|w| {
        let w = w.as_ref();
        let n = w.split_once('=').map_or(w, |(n, _)| n);
        names.contains(&n)
    })
}

/// Assignments `NAME=value` of any of `names` in the words of `c` (a script's `export
/// NAME=value`, `NAME=value cmd`, or the `env NAME=value` launcher), in order.
pub(crate) fn script_assignments(c: &Container, names: &[&str]) -> Vec<(String, String)> {
    // Splitting never makes a `=` (it only drops quotes, backslashes and blanks), so without
    // one in `command` and `args` there is no assignment, and no words need splitting.
    if !argv(c).any(|e| e.contains('=')) {
        return Vec::new();
    }
    container_words(c)
        .into_iter()
        .filter_map(|w| {
            let (n, v) = w.split_once('=')?;
            names.contains(&n).then(|| (n.to_owned(), v.to_owned()))
        })
        .collect()
}

/// A variable of `c`'s `env`: its last entry (later duplicates win, as in the kubelet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EnvValue {
    /// A literal value, with `$(VAR)` references to earlier literal entries expanded.
    Literal(String),
    /// From a Secret, ConfigMap, field or resource, or a literal whose references are not
    /// known: not known at admission.
    Unknown,
}

/// The value of `name` in `c`'s literal `env`; `None` when it is not set there.
pub(crate) fn env_value(c: &Container, name: &str) -> Option<EnvValue> {
    let env = c.env.as_deref().unwrap_or_default();
    let idx = env.iter().rposition(|e| e.name == name)?;
    Some(expand_entry(env, idx))
}

fn expand_entry(env: &[k8s_openapi::api::core::v1::EnvVar], idx: usize) -> EnvValue {
    let Some(e) = env.get(idx) else {
        return EnvValue::Unknown;
    };
    if e.value_from.is_some() {
        return EnvValue::Unknown;
    }
    let v = e.value.clone().unwrap_or_default();
    if !v.contains("$(") {
        return EnvValue::Literal(v);
    }
    // One level of `$(VAR)` from earlier literal entries; anything else is unknown.
    let mut out = String::new();
    let mut rest = v.as_str();
    while let Some(start) = rest.find("$(") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else {
            return EnvValue::Unknown;
        };
        let name = &after[..end];
        let earlier = env[..idx]
            .iter()
            .rposition(|x| x.name == name)
            .and_then(|j| env.get(j));
        match earlier {
            Some(x)
                if x.value_from.is_none() && !x.value.as_deref().unwrap_or("").contains("$(") =>
            {
                out.push_str(x.value.as_deref().unwrap_or(""));
            }
            _ => return EnvValue::Unknown,
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    EnvValue::Literal(out)
}

/// Every literal env entry of `c` as (name, value), the last of each name.
pub(crate) fn literal_env(c: &Container) -> Vec<(String, String)> {
    let env = c.env.as_deref().unwrap_or_default();
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, e) in env.iter().enumerate() {
        if env[i + 1..].iter().any(|x| x.name == e.name) {
            continue;
        }
        if let EnvValue::Literal(v) = expand_entry(env, i) {
            out.push((e.name.clone(), v));
        }
    }
    out
}

/// Whether anything in `c` refers to variable `name` at run time: `$(NAME)` in `env`, `command`
/// or `args`, or `$NAME` / `${NAME` in a shell string.
pub(crate) fn references(c: &Container, name: &str) -> bool {
    // Every form starts with `$`: without one anywhere, nothing refers to any variable.
    let env_values = || c.env.iter().flatten().filter_map(|e| e.value.as_deref());
    if !env_values().chain(argv(c)).any(|v| v.contains('$')) {
        return false;
    }
    let k8s = format!("$({name})");
    let sh = format!("${name}");
    let braced = format!("${{{name}");
    let in_env = env_values().any(|v| v.contains(&k8s));
    let in_argv = argv(c).any(|s| {
        s.contains(&k8s)
            || s.contains(&braced)
            || s.match_indices(&sh).any(|(i, _)| {
                let next = s[i + sh.len()..].chars().next();
                !next.is_some_and(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            })
    });
    in_env || in_argv
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};

    fn words(s: &str) -> Vec<String> {
        split_shell(s)
    }

    #[test]
    fn shell_strings_split_like_a_shell() {
        assert_eq!(
            words(r#"vllm serve x --speculative-config '{"model": "a b"}' && echo "q \"x\"""#),
            vec![
                "vllm",
                "serve",
                "x",
                "--speculative-config",
                r#"{"model": "a b"}"#,
                "&",
                "&",
                "echo",
                "q \"x\""
            ]
        );
        assert_eq!(words("a\\ b c;d"), vec!["a b", "c", ";", "d"]);
        assert_eq!(words(""), Vec::<String>::new());
    }

    #[test]
    fn json_elements_stay_whole() {
        let c = Container {
            args: Some(vec![
                "--speculative-config".into(),
                r#"{"model": "x", "num_speculative_tokens": 5}"#.into(),
            ]),
            ..Container::default()
        };
        let w = container_words(&c);
        assert_eq!(w.len(), 2);
        assert_eq!(
            flag_values(&w, &["--speculative-config"]),
            vec![Some(
                r#"{"model": "x", "num_speculative_tokens": 5}"#.to_owned()
            )]
        );
    }

    #[test]
    fn flags_and_lists() {
        let w: Vec<String> = [
            "--tokenizer",
            "--x",
            "--tokenizer=t",
            "--lora-modules",
            "a=/x",
            "b=y",
            "--z",
            "--tokenizer",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(
            flag_values(&w, &["--tokenizer"]),
            vec![None, Some("t".to_owned()), None]
        );
        assert_eq!(
            flag_lists(&w, &["--lora-modules"]),
            vec![vec!["a=/x".to_owned(), "b=y".to_owned()]]
        );
        assert!(has_flag(&w, &["--z"]));
        assert!(!has_flag(&w, &["--y"]));
    }

    #[test]
    fn env_values_expand_earlier_literals_only() {
        let c = Container {
            env: Some(vec![
                EnvVar {
                    name: "A".into(),
                    value: Some("/a".into()),
                    value_from: None,
                },
                EnvVar {
                    name: "B".into(),
                    value: Some("$(A)/b".into()),
                    value_from: None,
                },
                EnvVar {
                    name: "C".into(),
                    value: Some("$(D)/c".into()),
                    value_from: None,
                },
                EnvVar {
                    name: "D".into(),
                    value: Some("/d".into()),
                    value_from: None,
                },
                EnvVar {
                    name: "S".into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "s".into(),
                            key: "k".into(),
                            optional: None,
                        }),
                        ..EnvVarSource::default()
                    }),
                },
                EnvVar {
                    name: "A".into(),
                    value: Some("/a2".into()),
                    value_from: None,
                },
            ]),
            ..Container::default()
        };
        assert_eq!(env_value(&c, "A"), Some(EnvValue::Literal("/a2".into())));
        assert_eq!(env_value(&c, "B"), Some(EnvValue::Literal("/a/b".into())));
        assert_eq!(env_value(&c, "C"), Some(EnvValue::Unknown));
        assert_eq!(env_value(&c, "S"), Some(EnvValue::Unknown));
        assert_eq!(env_value(&c, "Z"), None);
        let lit = literal_env(&c);
        assert!(lit.contains(&("A".to_owned(), "/a2".to_owned())));
        assert!(!lit.iter().any(|(n, _)| n == "S" || n == "C"));
    }

    #[test]
    fn references_find_kubernetes_and_shell_forms() {
        let c = |args: &[&str]| Container {
            args: Some(args.iter().map(|s| (*s).to_owned()).collect()),
            ..Container::default()
        };
        assert!(references(&c(&["--dir", "$(HF_HOME)/x"]), "HF_HOME"));
        assert!(references(&c(&["sh", "-c", "cd $HF_HOME && x"]), "HF_HOME"));
        assert!(references(
            &c(&["sh", "-c", "cd ${HF_HOME:-/x}"]),
            "HF_HOME"
        ));
        assert!(!references(&c(&["sh", "-c", "cd $HF_HOME_X"]), "HF_HOME"));
        assert!(!references(&c(&["--x"]), "HF_HOME"));
        assert_eq!(
            script_assignments(
                &c(&["sh", "-c", "export HF_HOME=/data; HF_HUB_CACHE=/x vllm"]),
                &["HF_HOME", "HF_HUB_CACHE"]
            ),
            vec![
                ("HF_HOME".to_owned(), "/data".to_owned()),
                ("HF_HUB_CACHE".to_owned(), "/x".to_owned())
            ]
        );
    }
}
