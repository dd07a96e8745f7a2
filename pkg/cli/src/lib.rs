//! One command-line convention for every warmcache binary, present and future.
//!
//! - **Input** ([`input`]): `-f FILE`, with `-` for standard input; standard input is read at
//!   most once per command (`-f - --old -` is refused); every input is bounded by
//!   [`input::MAX_INPUT_BYTES`] and must be UTF-8.
//! - **YAML** ([`yaml`]): documents are read as `kubectl` reads them, including YAML 1.1 integer
//!   forms (`defaultMode: 0555` is octal 365, as the API server receives it from kubectl).
//! - **Exit codes** ([`exit`]): 0 ok, 1 refused (the input was read and judged), 2 unusable
//!   input, a wrong command line, or output that cannot be written.
//! - **Messages** ([`text`]): user-written values are bounded and invisible characters are
//!   escaped before they are printed.
//!
//! The crate is pure (no client, no tokio); the clap argument structs are behind the `args`
//! feature so pure crates can use the message helpers without clap.

pub mod exit;
pub mod input;
pub mod text;
pub mod yaml;

#[cfg(feature = "args")]
pub mod args;
