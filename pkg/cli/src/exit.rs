//! The exit-code scheme of every warmcache command.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | the command succeeded (validated: admitted; rendered; reported) |
//! | 1 | the input was read and refused (one `<field path>: <reason>` line per refusal on stdout) |
//! | 2 | the input cannot be used (unreadable, too large, not text, not YAML, not the expected kind), the command line is wrong (clap's own usage errors exit 2 too), or the output cannot be written |
//!
//! A write failure is never 1: a script that treats 1 as "refused" must not read a closed pipe
//! or a full disk as a verdict.

/// The command succeeded.
pub const OK: u8 = 0;
/// The input was read and refused.
pub const REFUSED: u8 = 1;
/// The input, the command line or the output was unusable.
pub const UNUSABLE: u8 = 2;

/// How a command that read its input ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Success (exit 0).
    Ok,
    /// Refused, with the refusals printed (exit 1).
    Refused,
}

impl Verdict {
    /// The process exit code of this verdict.
    pub const fn code(self) -> u8 {
        match self {
            Self::Ok => OK,
            Self::Refused => REFUSED,
        }
    }
}
