//! What a container runs: its argv after Kubernetes `$(VAR)` expansion, unwrapped from launchers
//! (`exec`, `env X=y`, `tini --`, ...) and, for `sh -c` / `bash -lc` style shells, the commands of
//! the script (recursively, a few levels deep).

use std::rc::Rc;

use k8s_openapi::api::core::v1::Container;

use crate::env::{Env, expand_k8s};
use crate::limits::{Bound, Budget, Hit, MAX_SHELL_DEPTH, Meter};
use crate::shell::{self, Command, Exports, SVal, Word};

const SHELLS: [&str; 6] = ["sh", "bash", "dash", "ash", "zsh", "ksh"];

/// One container, read once.
#[derive(Debug)]
pub(crate) struct View<'p> {
    pub(crate) container: &'p Container,
    /// Field path, e.g. `spec.initContainers[1]`.
    pub(crate) path: &'p str,
    pub(crate) env: Env<'p>,
    pub(crate) commands: Vec<Command>,
    /// `args` after `$(VAR)` expansion (used by the KServe storage-initializer rule).
    pub(crate) args: Vec<Word>,
    /// `workingDir` when it is an absolute path.
    pub(crate) cwd: Option<Rc<str>>,
    /// The first bound reading the container hit (then `env` and `commands` are not to be
    /// trusted), with the env entry it was hit at (`None`: command and args).
    pub(crate) limit: Option<Hit>,
}

impl<'p> View<'p> {
    /// Read `container` (at field path `path`), charging the work to the pod's `budget`.
    pub(crate) fn new(container: &'p Container, path: &'p str, budget: &Budget) -> View<'p> {
        let meter = Meter::new(budget);
        let env = Env::of(container, path, &meter);
        let expand = |s: &String| {
            let (text, unknown) = expand_k8s(s, |n| env.lookup_for_expansion(n), &meter);
            Word {
                text: text.into_owned(),
                unknown,
            }
        };
        let args: Vec<Word> = container.args.iter().flatten().map(expand).collect();
        let mut argv: Vec<Word> = Vec::with_capacity(args.len() + 2);
        match container.command.as_deref() {
            Some(cmd) if !cmd.is_empty() => argv.extend(cmd.iter().map(expand)),
            _ => argv.extend(image_entrypoint(
                container.image.as_deref().unwrap_or_default(),
                &args,
            )),
        }
        argv.extend(args.iter().cloned());
        let mut commands = Vec::new();
        let cwd: Option<Rc<str>> = container
            .working_dir
            .as_deref()
            .filter(|d| d.starts_with('/'))
            .map(|d| Rc::from(crate::paths::clean(d)));
        if meter.hit().is_none() {
            emit(
                argv,
                Exports::default(),
                cwd.clone(),
                &env,
                &meter,
                0,
                &mut commands,
            );
        }
        View {
            container,
            path,
            env,
            commands,
            args,
            cwd,
            limit: meter.hit(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.container.name
    }

    pub(crate) fn image(&self) -> &str {
        self.container.image.as_deref().unwrap_or_default()
    }
}

/// Entrypoints of well-known images, used when a container sets `args` but no `command`.
fn image_entrypoint(image: &str, args: &[Word]) -> Vec<Word> {
    let repo = image_repository(image);
    let last = repo.rsplit('/').next().unwrap_or_default();
    match last {
        "aws-cli" | "awscli" => vec![Word::known("aws")],
        "s5cmd" => vec![Word::known("s5cmd")],
        // vllm/vllm-openai images run `vllm serve` (older ones the OpenAI server module, which
        // needs --model; a positional model only works with the newer entrypoint).
        "vllm-openai" if args.first().is_some_and(|a| !a.text.starts_with('-')) => {
            vec![Word::known("vllm"), Word::known("serve")]
        }
        _ => Vec::new(),
    }
}

/// The repository part of an image reference (no tag, no digest).
pub(crate) fn image_repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or_default();
    match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    }
}

pub(crate) fn basename(w: &Word) -> &str {
    w.text.rsplit('/').next().unwrap_or_default()
}

fn emit(
    words: Vec<Word>,
    overrides: Exports,
    cwd: Option<Rc<str>>,
    env: &Env,
    meter: &Meter<'_>,
    depth: usize,
    out: &mut Vec<Command>,
) {
    let (words, overrides, cwd) = unwrap(words, overrides, cwd, meter);
    if words.is_empty() || meter.hit().is_some() {
        return;
    }
    if let Some(script) = shell_script(&words) {
        if depth >= MAX_SHELL_DEPTH {
            // Not read: what it runs is not known, and the container is refused.
            meter.exceed(Bound::ShellDepth);
            return;
        }
        for cmd in shell::parse(&script.text, env, meter, &overrides, cwd) {
            emit(
                cmd.words,
                cmd.overrides,
                cmd.cwd,
                env,
                meter,
                depth + 1,
                out,
            );
        }
        return;
    }
    out.push(Command {
        words,
        overrides,
        cwd,
    });
}

/// Strip launchers that run the rest of their argv as the real command.
fn unwrap(
    mut words: Vec<Word>,
    mut overrides: Exports,
    mut cwd: Option<Rc<str>>,
    meter: &Meter<'_>,
) -> (Vec<Word>, Exports, Option<Rc<str>>) {
    let set = |overrides: &mut Exports, name: &str, val: SVal| {
        if let Some(e) = overrides.with(Rc::from(name), val, meter) {
            *overrides = e;
        }
    };
    let mut start = 0;
    // Bounded: each pass consumes at least one word.
    while let Some(w) = words.get(start) {
        if w.unknown {
            break;
        }
        let prog = basename(w);
        let rest = &words[start + 1..];
        let skip = match prog {
            "exec" => 1 + options(rest, &["-a"]),
            "nohup" | "setsid" | "builtin" => 1 + options(rest, &[]),
            "command" if rest.first().is_some_and(|w| !w.text.starts_with('-')) => 1,
            "time" => 1 + options(rest, &[]),
            "stdbuf" => 1 + options(rest, &["-i", "-o", "-e"]),
            "nice" => 1 + options(rest, &["-n"]),
            "sudo" => {
                1 + options(
                    rest,
                    &["-u", "-g", "-C", "-D", "-h", "-p", "-U", "-r", "-t", "-T"],
                )
            }
            "tini" | "tini-static" | "dumb-init" | "catatonit" => {
                let n = options(rest, &["-p", "-e", "-r"]);
                1 + n + usize::from(rest.get(n).is_some_and(|w| w.text == "--"))
            }
            "timeout" => {
                let n = options(rest, &["-s", "-k"]);
                // then the duration
                1 + n + usize::from(rest.get(n).is_some())
            }
            "busybox"
                if rest
                    .first()
                    .is_some_and(|w| SHELLS.contains(&w.text.as_str())) =>
            {
                1
            }
            "env" => {
                let mut k = 0;
                while let Some(a) = rest.get(k) {
                    let t = a.text.as_str();
                    if t == "--" {
                        k += 1;
                        break;
                    } else if t == "-u" || t == "--unset" {
                        if let Some(n) = rest.get(k + 1) {
                            set(&mut overrides, &n.text, SVal::Unset);
                        }
                        k += 2;
                    } else if let Some(n) = t.strip_prefix("--unset=") {
                        set(&mut overrides, n, SVal::Unset);
                        k += 1;
                    } else if t == "-C" || t == "--chdir" {
                        cwd = rest.get(k + 1).and_then(|d| chdir(cwd.as_deref(), d));
                        k += 2;
                    } else if let Some(d) = t.strip_prefix("--chdir=") {
                        cwd = chdir(
                            cwd.as_deref(),
                            &Word {
                                text: d.to_owned(),
                                unknown: a.unknown,
                            },
                        );
                        k += 1;
                    } else if t.starts_with('-') {
                        k += 1;
                    } else if let Some((name, value)) = t.split_once('=')
                        && !name.is_empty()
                        && !name.contains('/')
                    {
                        let val = if a.unknown {
                            SVal::Unknown
                        } else {
                            SVal::known(value)
                        };
                        set(&mut overrides, name, val);
                        k += 1;
                    } else {
                        break;
                    }
                }
                1 + k
            }
            _ => break,
        };
        start += skip;
    }
    if start > 0 {
        words.drain(..start.min(words.len()));
    }
    (words, overrides, cwd)
}

fn chdir(cwd: Option<&str>, dir: &Word) -> Option<Rc<str>> {
    if dir.unknown {
        return None;
    }
    if dir.text.starts_with('/') {
        Some(Rc::from(crate::paths::clean(&dir.text)))
    } else {
        cwd.map(|c| Rc::from(crate::paths::join(c, &dir.text)))
    }
}

/// Leading option words of a launcher; `with_value` options consume the next word too.
fn options(rest: &[Word], with_value: &[&str]) -> usize {
    let mut k = 0;
    while let Some(w) = rest.get(k) {
        let t = w.text.as_str();
        if t == "--" || !t.starts_with('-') || t == "-" {
            break;
        }
        k += if with_value.contains(&t) { 2 } else { 1 };
    }
    k.min(rest.len())
}

/// For `sh -c SCRIPT ...` (any option cluster containing `c`), the script word.
fn shell_script(words: &[Word]) -> Option<&Word> {
    let prog = basename(words.first()?);
    if !SHELLS.contains(&prog) {
        return None;
    }
    let mut saw_c = false;
    let mut j = 1;
    while let Some(w) = words.get(j) {
        let t = w.text.as_str();
        if t == "--" || t == "-" {
            j += 1;
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            j += if matches!(long, "rcfile" | "init-file") {
                2
            } else {
                1
            };
            continue;
        }
        if (t.starts_with('-') || t.starts_with('+')) && t.len() > 1 {
            let opts = &t[1..];
            saw_c |= opts.contains('c');
            j += if opts.contains(['o', 'O']) { 2 } else { 1 };
            continue;
        }
        break;
    }
    if saw_c { words.get(j) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(command: &[&str], args: &[&str]) -> Container {
        Container {
            name: "main".into(),
            command: (!command.is_empty())
                .then(|| command.iter().map(|s| (*s).to_owned()).collect()),
            args: (!args.is_empty()).then(|| args.iter().map(|s| (*s).to_owned()).collect()),
            ..Default::default()
        }
    }

    fn texts(v: &View<'_>) -> Vec<Vec<String>> {
        v.commands
            .iter()
            .map(|c| c.words.iter().map(|w| w.text.clone()).collect())
            .collect()
    }

    #[test]
    fn shells_and_launchers_are_unwrapped() {
        let ct = c(
            &[
                "/usr/bin/tini",
                "--",
                "/bin/bash",
                "-euo",
                "pipefail",
                "-lc",
            ],
            &["exec env HF_HOME=/x nohup sh -c 'vllm serve m/n'"],
        );
        let budget = Budget::default();
        let v = View::new(&ct, "spec.containers[0]", &budget);
        assert_eq!(texts(&v), vec![vec!["vllm", "serve", "m/n"]]);
        assert_eq!(
            v.commands[0].overrides.get("HF_HOME"),
            Some(&SVal::known("/x"))
        );
    }

    #[test]
    fn shell_without_c_is_a_script_file() {
        let ct = c(&["bash", "/start.sh"], &[]);
        let v = View::new(&ct, "spec.containers[0]", &Budget::default());
        assert_eq!(texts(&v), vec![vec!["bash", "/start.sh"]]);
    }

    #[test]
    fn image_entrypoints() {
        assert_eq!(image_repository("amazon/aws-cli:2.15.0"), "amazon/aws-cli");
        assert_eq!(
            image_repository("localhost:5000/x/vllm-openai@sha256:ab"),
            "localhost:5000/x/vllm-openai"
        );
        assert_eq!(image_repository("localhost:5000/x"), "localhost:5000/x");
        let mut ct = c(&[], &["s3", "sync", "s3://b/k", "/mnt/models"]);
        ct.image = Some("amazon/aws-cli".into());
        let v = View::new(&ct, "spec.initContainers[0]", &Budget::default());
        assert_eq!(texts(&v)[0][..3], ["aws", "s3", "sync"]);
    }
}
