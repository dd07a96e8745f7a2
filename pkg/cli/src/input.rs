//! Reading a command's input files: `-` is standard input, read at most once per command; every
//! input is bounded by [`MAX_INPUT_BYTES`] and must be UTF-8 text.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::text;

/// The largest input any command reads: 4 MiB. Kubernetes objects are far smaller (etcd's
/// default request limit is 1.5 MiB, and `kubectl` manifests of whole charts stay well under
/// this), so a larger input is a mistake or an attack (`-f /dev/zero`), refused before it is
/// held in memory.
pub const MAX_INPUT_BYTES: u64 = 4 * 1024 * 1024;

/// Why an input cannot be used (exit code [`crate::exit::UNUSABLE`]).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file cannot be opened or read.
    #[error("cannot read {name}: {source}")]
    Read {
        /// The input as shown to the user (`standard input`, or the escaped path).
        name: String,
        /// Why.
        source: std::io::Error,
    },
    /// The input is larger than [`MAX_INPUT_BYTES`].
    #[error("{name} is larger than {limit} bytes, the most a command reads; nothing was done")]
    TooLarge {
        /// The input.
        name: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// The input is not UTF-8 text.
    #[error(
        "{name} is not UTF-8 text (invalid byte at offset {offset}), so it is not YAML or JSON"
    )]
    NotText {
        /// The input.
        name: String,
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// Two flags ask for standard input.
    #[error(
        "{first} and {second} both read standard input (`-`); it can be read only once: give one of them a file"
    )]
    StdinTwice {
        /// The first flag naming `-`.
        first: String,
        /// The second.
        second: String,
    },
}

/// Where one input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Standard input (`-`).
    Stdin,
    /// A file.
    File(PathBuf),
}

impl Source {
    /// The source `path` names: `-` is standard input.
    pub fn of(path: &Path) -> Self {
        if path == Path::new("-") {
            Self::Stdin
        } else {
            Self::File(path.to_owned())
        }
    }

    /// How the input is named in messages (escaped: a path is user input).
    pub fn name(&self) -> String {
        match self {
            Self::Stdin => "standard input".to_owned(),
            Self::File(p) => text::path(&p.to_string_lossy()),
        }
    }
}

/// Refuses a command line in which more than one flag names standard input, before anything is
/// read. `inputs` pairs each flag (`-f`, `--old`) with the path it was given, if any.
pub fn stdin_at_most_once(inputs: &[(&str, Option<&Path>)]) -> Result<(), InputError> {
    let mut stdin = inputs
        .iter()
        .filter(|(_, p)| p.is_some_and(|p| p == Path::new("-")))
        .map(|(flag, _)| *flag);
    match (stdin.next(), stdin.next()) {
        (Some(first), Some(second)) => Err(InputError::StdinTwice {
            first: first.to_owned(),
            second: second.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Reads all of `reader` (named `name` in messages) as UTF-8 text of at most `limit` bytes.
pub fn read_bounded(reader: impl Read, name: &str, limit: u64) -> Result<String, InputError> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| InputError::Read {
            name: name.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            name: name.to_owned(),
            limit,
        });
    }
    String::from_utf8(bytes).map_err(|e| InputError::NotText {
        name: name.to_owned(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Reads the input `path` names (`-`: standard input), bounded by [`MAX_INPUT_BYTES`].
pub fn read(path: &Path) -> Result<String, InputError> {
    read_source(&Source::of(path), MAX_INPUT_BYTES)
}

/// Reads `source`, bounded by `limit` bytes.
pub fn read_source(source: &Source, limit: u64) -> Result<String, InputError> {
    let name = source.name();
    match source {
        Source::Stdin => read_bounded(std::io::stdin().lock(), &name, limit),
        Source::File(p) => {
            let file = std::fs::File::open(p).map_err(|source| InputError::Read {
                name: name.clone(),
                source,
            })?;
            read_bounded(file, &name, limit)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_input_is_refused_at_the_limit() {
        let endless = std::io::repeat(b'a');
        let Err(e) = read_bounded(endless, "standard input", 1024) else {
            panic!("an endless input must be refused");
        };
        assert!(matches!(e, InputError::TooLarge { limit: 1024, .. }), "{e}");
        assert!(e.to_string().contains("larger than 1024 bytes"), "{e}");
    }

    #[test]
    fn an_input_at_the_limit_is_read() {
        let text = "a".repeat(1024);
        let read = read_bounded(text.as_bytes(), "x", 1024);
        assert_eq!(read.ok().as_deref(), Some(text.as_str()));
    }

    #[test]
    fn dev_zero_is_refused() {
        let Err(e) = read(Path::new("/dev/zero")) else {
            panic!("/dev/zero must be refused");
        };
        assert!(matches!(e, InputError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn binary_input_is_not_text() {
        let Err(e) = read_bounded(&b"ab\xffcd"[..], "f", 100) else {
            panic!("invalid UTF-8 must be refused");
        };
        assert!(matches!(e, InputError::NotText { offset: 2, .. }), "{e}");
    }

    #[test]
    fn stdin_is_read_at_most_once() {
        let dash = Path::new("-");
        let file = Path::new("old.yaml");
        assert!(stdin_at_most_once(&[("-f", Some(dash)), ("--old", Some(file))]).is_ok());
        assert!(stdin_at_most_once(&[("-f", Some(dash)), ("--old", None)]).is_ok());
        let Err(e) = stdin_at_most_once(&[("-f", Some(dash)), ("--old", Some(dash))]) else {
            panic!("two flags reading stdin must be refused");
        };
        assert_eq!(
            e.to_string(),
            "-f and --old both read standard input (`-`); it can be read only once: give one of them a file"
        );
    }

    #[test]
    fn a_missing_file_names_the_escaped_path() {
        let Err(e) = read(Path::new("/nonexistent/a\u{200b}b.yaml")) else {
            panic!("a missing file must be an error");
        };
        assert!(
            e.to_string()
                .starts_with("cannot read /nonexistent/a\\u{200b}b.yaml: "),
            "{e}"
        );
    }
}
