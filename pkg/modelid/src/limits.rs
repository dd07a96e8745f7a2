//! Bounds on the work one resolution does, whatever the pod.
//!
//! Resolution runs in the admission path of every pod, so its time and memory must not depend on
//! what the pod's values *describe* (`A=$A$A` doubles a value per line; a chain of `$(V)` env
//! references doubles it per entry), only on the size of the pod itself. Every expansion and
//! every copy is therefore metered. A value past a bound is not truncated: it becomes *unknown*,
//! the container that produced it is marked, and the resolver leaves the pod alone with a reason
//! that names the bound ([`crate::Unresolved::UnknownValue`]).

use std::cell::Cell;

/// Longest value one expansion may produce, in bytes: one env value after `$(VAR)` expansion, one
/// argument, or one word of a script after `$VAR` expansion.
///
/// The API server stores objects of at most about 1.5 MiB (etcd's default request limit), so a
/// literal value of a real pod stays below this; only repetition (`$(A)$(A)`, `A=$A$A`) gets
/// past it, and no such value names a model, a path or an endpoint.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// Bytes that all expansions of one pod may produce together (every variable value inserted
/// into an env value, an argument or a script word, and every working directory built by a
/// relative `cd`). Four times [`MAX_VALUE_BYTES`]: a pod may copy a large literal a few times
/// (`echo "$CONFIG" > f`), but no real pod copies megabytes; this bounds the memory and time of
/// a resolution to a small constant on top of the pod's own size.
pub const MAX_EXPANSION_BYTES: usize = 4 * MAX_VALUE_BYTES;

/// How deep `sh -c "bash -c '...'"` nesting is followed. Real entrypoints nest two levels at
/// most (`tini -- bash -c "exec sh -c ..."`); every level re-reads its script, so depth
/// multiplies the work.
pub const MAX_SHELL_DEPTH: usize = 4;

/// Environment changes the scripts of one container may make visible to their commands (each
/// `export`, each assignment to an exported variable, each `A=b cmd` prefix, each `env A=b`
/// launcher assignment). Each command shares the changes made before it instead of copying them,
/// and a lookup walks at most this many changes; real scripts export a few dozen variables.
pub const MAX_EXPORTS: usize = 256;

/// Simple commands the scripts of one pod may run, counted as they are read (nested scripts
/// included). A chart's inline script runs tens to a few hundred commands; fan-out through
/// nested shells (`sh -c "$L"` where `$L` runs `sh -c` again) multiplies the count.
pub const MAX_COMMANDS: usize = 10_000;

/// Longest destination path, in bytes (Linux `PATH_MAX`): the kernel refuses longer paths, so no
/// container writes a download there, and a longer value is not a landing.
pub const MAX_PATH_BYTES: usize = 4096;

/// Longest reason, in bytes. Values quoted in a reason are already cut by
/// `warmcache_cli::text::shown`; this bounds reasons that nest other reasons.
pub const MAX_REASON_BYTES: usize = 2048;

/// Which bound was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    ValueBytes,
    ExpansionBytes,
    ShellDepth,
    Exports,
    Commands,
}

impl Bound {
    /// What was exceeded, naming the constant.
    pub(crate) fn describe(self) -> String {
        match self {
            Bound::ValueBytes => {
                format!("a value expands past {MAX_VALUE_BYTES} bytes (MAX_VALUE_BYTES)")
            }
            Bound::ExpansionBytes => format!(
                "the pod's expansions pass {MAX_EXPANSION_BYTES} bytes in all (MAX_EXPANSION_BYTES)"
            ),
            Bound::ShellDepth => format!(
                "shells are nested more than {MAX_SHELL_DEPTH} levels deep (MAX_SHELL_DEPTH)"
            ),
            Bound::Exports => format!(
                "the scripts change the environment of their commands more than {MAX_EXPORTS} times (MAX_EXPORTS)"
            ),
            Bound::Commands => {
                format!("the pod's scripts run more than {MAX_COMMANDS} commands (MAX_COMMANDS)")
            }
        }
    }
}

/// What one pod's resolution may still spend (shared by all its containers).
#[derive(Debug, Default)]
pub(crate) struct Budget {
    expanded: Cell<usize>,
    commands: Cell<usize>,
}

impl Budget {
    /// Bytes expanded so far.
    pub(crate) fn expanded(&self) -> usize {
        self.expanded.get()
    }

    /// Commands read so far.
    pub(crate) fn commands(&self) -> usize {
        self.commands.get()
    }
}

/// The first bound a container hit: which, and at which env entry (`None`: its command or args).
pub(crate) type Hit = (Bound, Option<usize>);

/// The meter of one container: the pod's [`Budget`] plus the container's own counts, and the
/// first bound it hit. After a hit every further expansion fails at once, so the rest of the
/// container costs no more than reading it.
#[derive(Debug)]
pub(crate) struct Meter<'b> {
    budget: &'b Budget,
    exports: Cell<usize>,
    /// The env entry being expanded, for the field of a hit.
    site: Cell<Option<usize>>,
    hit: Cell<Option<Hit>>,
}

impl<'b> Meter<'b> {
    pub(crate) fn new(budget: &'b Budget) -> Meter<'b> {
        Meter {
            budget,
            exports: Cell::new(0),
            site: Cell::new(None),
            hit: Cell::new(None),
        }
    }

    /// Expansions from here on belong to env entry `index` (`None`: command and args).
    pub(crate) fn at(&self, index: Option<usize>) {
        self.site.set(index);
    }

    /// The first bound hit, if any.
    pub(crate) fn hit(&self) -> Option<Hit> {
        self.hit.get()
    }

    /// Record that `bound` was hit (the first hit is kept).
    pub(crate) fn exceed(&self, bound: Bound) {
        if self.hit.get().is_none() {
            self.hit.set(Some((bound, self.site.get())));
        }
    }

    /// Charge an expansion that inserts `n` bytes into a value that is then `len` bytes long.
    /// `false`: a bound is hit (now or before); the value must be treated as unknown.
    pub(crate) fn expand(&self, len: usize, n: usize) -> bool {
        if self.hit.get().is_some() {
            return false;
        }
        if len > MAX_VALUE_BYTES {
            self.exceed(Bound::ValueBytes);
            return false;
        }
        let total = self.budget.expanded.get().saturating_add(n);
        if total > MAX_EXPANSION_BYTES {
            self.exceed(Bound::ExpansionBytes);
            return false;
        }
        self.budget.expanded.set(total);
        true
    }

    /// Charge one environment change made visible to commands. `false`: past [`MAX_EXPORTS`].
    pub(crate) fn export(&self) -> bool {
        if self.hit.get().is_some() {
            return false;
        }
        let n = self.exports.get() + 1;
        if n > MAX_EXPORTS {
            self.exceed(Bound::Exports);
            return false;
        }
        self.exports.set(n);
        true
    }

    /// Charge one command read from a script. `false`: past [`MAX_COMMANDS`] for the pod.
    pub(crate) fn command(&self) -> bool {
        if self.hit.get().is_some() {
            return false;
        }
        let n = self.budget.commands.get() + 1;
        if n > MAX_COMMANDS {
            self.exceed(Bound::Commands);
            return false;
        }
        self.budget.commands.set(n);
        true
    }
}
