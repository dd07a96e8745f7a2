//! A small reader for the POSIX shell strings containers run (`sh -c "..."`, `bash -lc "..."`).
//!
//! It reads a script the way a shell would far enough to list the simple commands it runs, each
//! as its words after expansion: quotes and backslashes, `&&`, `||`, `;`, `|`, `&`, newlines,
//! subshell parentheses, comments, redirections (`>`, `2>&1`, `&>`, here-documents; their targets
//! are dropped), reserved words (`if`, `then`, `do`, ...), assignments (`A=b`, `export A=b`,
//! `A=b cmd`), `cd`, and field splitting of unquoted expansions. `$VAR` and `${VAR}` (plus the
//! `${VAR:-default}` family) expand from the container's literal env and the script's own
//! assignments only; anything else (`valueFrom`, image env, `$(...)`, backquotes, `$1`, other
//! `${...}` operators) makes the word *unknown*, and callers must not guess from an unknown word.
//! Nothing here panics on any input (property- and fuzz-tested).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::env::{Env, Val};
use crate::limits::Meter;
use crate::paths;

/// One word after expansion.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Word {
    /// The text; unknown parts are kept verbatim (`$MODEL`, `$(cat f)`).
    pub(crate) text: String,
    /// Some part could not be expanded from what admission knows.
    pub(crate) unknown: bool,
}

impl Word {
    pub(crate) fn known(text: impl Into<String>) -> Word {
        Word {
            text: text.into(),
            unknown: false,
        }
    }
}

/// A value assigned by the script (or a command prefix) that overrides the container env.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SVal {
    Known(Rc<str>),
    Unknown,
    Unset,
}

impl SVal {
    pub(crate) fn known(s: &str) -> SVal {
        SVal::Known(Rc::from(s))
    }
}

#[derive(Debug)]
struct Frame {
    name: Rc<str>,
    val: SVal,
    next: Option<Rc<Frame>>,
}

/// Environment changes visible to a command's process (exports of its scripts, `A=b cmd`
/// prefixes, `env A=b` launchers), newest first. Commands share the changes made before them
/// (a persistent list), so a script's commands cost no copy of its exports; the list is at most
/// [`crate::limits::MAX_EXPORTS`] long, which bounds a lookup.
#[derive(Debug, Clone, Default)]
pub(crate) struct Exports(Option<Rc<Frame>>);

impl Exports {
    /// The latest change of `name`, if any.
    pub(crate) fn get(&self, name: &str) -> Option<&SVal> {
        let mut frame = self.0.as_deref();
        while let Some(f) = frame {
            if &*f.name == name {
                return Some(&f.val);
            }
            frame = f.next.as_deref();
        }
        None
    }

    /// These changes and then `name` set to `val`; `None` when the meter refuses one more.
    pub(crate) fn with(&self, name: Rc<str>, val: SVal, meter: &Meter<'_>) -> Option<Exports> {
        meter.export().then(|| {
            Exports(Some(Rc::new(Frame {
                name,
                val,
                next: self.0.clone(),
            })))
        })
    }
}

/// One simple command a script runs.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    pub(crate) words: Vec<Word>,
    /// Environment changes visible to this command's process (later wins).
    pub(crate) overrides: Exports,
    /// Working directory when known.
    pub(crate) cwd: Option<Rc<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit {
        text: String,
        quoted: bool,
    },
    Var {
        name: String,
        quoted: bool,
        /// `${NAME:-x}` (`colon`) or `${NAME-x}`; `text` is `None` when the default itself expands.
        default: Option<(bool, Option<String>)>,
    },
    Opaque {
        raw: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(Vec<Part>),
    Sep,
}

fn is_meta(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\r' | b'\n' | b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')'
    )
}

fn push_lit(parts: &mut Vec<Part>, text: &str, quoted: bool) {
    if let Some(Part::Lit { text: t, quoted: q }) = parts.last_mut()
        && *q == quoted
    {
        t.push_str(text);
        return;
    }
    parts.push(Part::Lit {
        text: text.to_owned(),
        quoted,
    });
}

/// Reads a script one token at a time, so a script is never held as a whole token list.
struct Lexer<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    /// The token read by the last step, if any.
    out: Option<Tok>,
    /// The last token handed out was a separator (or there was none yet).
    after_sep: bool,
    heredocs: Vec<(String, bool)>,
}

impl<'a> Lexer<'a> {
    fn new(s: &'a str) -> Lexer<'a> {
        Lexer {
            s,
            b: s.as_bytes(),
            i: 0,
            out: None,
            after_sep: true,
            heredocs: Vec::new(),
        }
    }
}

impl Lexer<'_> {
    fn at(&self, k: usize) -> Option<u8> {
        self.b.get(self.i + k).copied()
    }

    fn sep(&mut self) {
        if !self.after_sep {
            self.out = Some(Tok::Sep);
            self.after_sep = true;
        }
    }

    fn push_word(&mut self, parts: Vec<Part>) {
        self.out = Some(Tok::Word(parts));
        self.after_sep = false;
    }

    /// The next token; `None` at the end. Every step consumes input or yields a token.
    fn next_tok(&mut self) -> Option<Tok> {
        while self.out.is_none() {
            let c = self.at(0)?;
            self.step(c);
        }
        self.out.take()
    }

    fn step(&mut self, c: u8) {
        {
            match c {
                b' ' | b'\t' | b'\r' => self.i += 1,
                b'\n' => {
                    self.i += 1;
                    self.sep();
                    self.skip_heredocs();
                }
                b';' | b'(' | b')' => {
                    self.i += 1;
                    self.sep();
                }
                b'|' => {
                    self.i += 1;
                    if matches!(self.at(0), Some(b'|' | b'&')) {
                        self.i += 1;
                    }
                    self.sep();
                }
                b'&' => {
                    if self.at(1) == Some(b'>') {
                        self.i += 2;
                        if self.at(0) == Some(b'>') {
                            self.i += 1;
                        }
                        self.redirect_target(None);
                    } else {
                        self.i += 1;
                        if self.at(0) == Some(b'&') {
                            self.i += 1;
                        }
                        self.sep();
                    }
                }
                b'<' | b'>' => self.redirect(),
                b'#' => {
                    while let Some(c) = self.at(0) {
                        if c == b'\n' {
                            break;
                        }
                        self.i += 1;
                    }
                }
                _ => {
                    let start = self.i;
                    let parts = self.word();
                    let io_number = matches!(parts.as_slice(), [Part::Lit { text, quoted: false }]
                        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()));
                    if io_number && matches!(self.at(0), Some(b'<' | b'>')) {
                        self.redirect();
                    } else if !parts.is_empty() {
                        self.push_word(parts);
                    } else if self.i == start {
                        // Defensive: never loop without progress.
                        self.i += 1;
                    }
                }
            }
        }
    }

    /// At `<` or `>`: read the operator and drop its target.
    fn redirect(&mut self) {
        let mut heredoc = None;
        match self.at(0) {
            Some(b'<') => {
                self.i += 1;
                match self.at(0) {
                    Some(b'<') => {
                        self.i += 1;
                        match self.at(0) {
                            Some(b'<') => self.i += 1,
                            Some(b'-') => {
                                self.i += 1;
                                heredoc = Some(true);
                            }
                            _ => heredoc = Some(false),
                        }
                    }
                    Some(b'&' | b'>') => self.i += 1,
                    _ => {}
                }
            }
            _ => {
                self.i += 1;
                if matches!(self.at(0), Some(b'>' | b'|' | b'&')) {
                    self.i += 1;
                }
            }
        }
        self.redirect_target(heredoc);
    }

    fn redirect_target(&mut self, heredoc: Option<bool>) {
        while matches!(self.at(0), Some(b' ' | b'\t')) {
            self.i += 1;
        }
        match self.at(0) {
            Some(c) if !is_meta(c) => {}
            _ => return,
        }
        let parts = self.word();
        if let Some(strip_tabs) = heredoc {
            let mut delim = String::new();
            for p in &parts {
                match p {
                    Part::Lit { text, .. } => delim.push_str(text),
                    Part::Var { name, .. } => {
                        delim.push('$');
                        delim.push_str(name);
                    }
                    Part::Opaque { raw } => delim.push_str(raw),
                }
            }
            self.heredocs.push((delim, strip_tabs));
        }
    }

    /// After a newline: skip the bodies of pending here-documents.
    fn skip_heredocs(&mut self) {
        let pending = std::mem::take(&mut self.heredocs);
        for (delim, strip_tabs) in pending {
            loop {
                if self.i >= self.b.len() {
                    return;
                }
                let end = self.s[self.i..]
                    .find('\n')
                    .map_or(self.b.len(), |k| self.i + k);
                let line = &self.s[self.i..end];
                let line = if strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    line
                };
                let done = line == delim;
                self.i = (end + 1).min(self.b.len());
                if done {
                    break;
                }
            }
        }
    }

    /// One word, up to an unquoted metacharacter.
    fn word(&mut self) -> Vec<Part> {
        let mut parts = Vec::new();
        while let Some(c) = self.at(0) {
            if is_meta(c) {
                break;
            }
            match c {
                b'\\' => {
                    if self.at(1) == Some(b'\n') {
                        self.i += 2;
                    } else if let Some(ch) = self.s.get(self.i + 1..).and_then(|r| r.chars().next())
                    {
                        let mut buf = [0u8; 4];
                        push_lit(&mut parts, ch.encode_utf8(&mut buf), true);
                        self.i += 1 + ch.len_utf8();
                    } else {
                        self.i += 1;
                    }
                }
                b'\'' => {
                    let start = self.i + 1;
                    let end = self.s[start..]
                        .find('\'')
                        .map_or(self.b.len(), |k| start + k);
                    push_lit(&mut parts, &self.s[start..end], true);
                    self.i = (end + 1).min(self.b.len());
                }
                b'"' => self.double_quoted(&mut parts),
                b'$' => self.dollar(&mut parts, false),
                b'`' => self.backtick(&mut parts),
                _ => {
                    let start = self.i;
                    while let Some(c) = self.at(0) {
                        if is_meta(c) || matches!(c, b'\\' | b'\'' | b'"' | b'$' | b'`') {
                            break;
                        }
                        self.i += 1;
                    }
                    push_lit(&mut parts, &self.s[start..self.i], false);
                }
            }
        }
        parts
    }

    fn double_quoted(&mut self, parts: &mut Vec<Part>) {
        self.i += 1;
        push_lit(parts, "", true);
        while let Some(c) = self.at(0) {
            match c {
                b'"' => {
                    self.i += 1;
                    return;
                }
                b'\\' => match self.at(1) {
                    Some(b'\n') => self.i += 2,
                    Some(n @ (b'$' | b'`' | b'"' | b'\\')) => {
                        push_lit(
                            parts,
                            if n == b'$' {
                                "$"
                            } else {
                                &self.s[self.i + 1..self.i + 2]
                            },
                            true,
                        );
                        self.i += 2;
                    }
                    _ => {
                        push_lit(parts, "\\", true);
                        self.i += 1;
                    }
                },
                b'$' => self.dollar(parts, true),
                b'`' => self.backtick(parts),
                _ => {
                    let start = self.i;
                    while let Some(c) = self.at(0) {
                        if matches!(c, b'"' | b'\\' | b'$' | b'`') {
                            break;
                        }
                        self.i += 1;
                    }
                    push_lit(parts, &self.s[start..self.i], true);
                }
            }
        }
    }

    fn backtick(&mut self, parts: &mut Vec<Part>) {
        let start = self.i;
        self.i += 1;
        while let Some(c) = self.at(0) {
            self.i += 1;
            if c == b'\\' {
                self.i = (self.i + 1).min(self.b.len());
            } else if c == b'`' {
                break;
            }
        }
        let end = self.i.min(self.b.len());
        parts.push(Part::Opaque {
            raw: self.s.get(start..end).unwrap_or_default().to_owned(),
        });
    }

    /// Index just past the `)` matching the `(` at `open`, skipping quoted text.
    fn matching_paren(&self, open: usize) -> usize {
        let mut depth = 0usize;
        let mut k = open;
        while let Some(&c) = self.b.get(k) {
            match c {
                b'(' => depth += 1,
                b')' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return k + 1;
                    }
                }
                b'\'' => {
                    k = self.s[k + 1..]
                        .find('\'')
                        .map_or(self.b.len(), |e| k + 1 + e);
                }
                b'\\' => k += 1,
                _ => {}
            }
            k += 1;
        }
        self.b.len()
    }

    fn dollar(&mut self, parts: &mut Vec<Part>, quoted: bool) {
        match self.at(1) {
            Some(b'{') => {
                let open = self.i + 2;
                let mut depth = 1usize;
                let mut k = open;
                while let Some(&c) = self.b.get(k) {
                    match c {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                if k >= self.b.len() {
                    parts.push(Part::Opaque {
                        raw: self.s[self.i..].to_owned(),
                    });
                    self.i = self.b.len();
                    return;
                }
                let inner = &self.s[open..k];
                let raw = &self.s[self.i..=k];
                self.i = k + 1;
                parts.push(brace(inner, raw, quoted));
            }
            Some(b'(') => {
                let end = self.matching_paren(self.i + 1);
                parts.push(Part::Opaque {
                    raw: self.s[self.i..end].to_owned(),
                });
                self.i = end;
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i + 1;
                let mut k = start;
                while self
                    .b
                    .get(k)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
                {
                    k += 1;
                }
                parts.push(Part::Var {
                    name: self.s[start..k].to_owned(),
                    quoted,
                    default: None,
                });
                self.i = k;
            }
            Some(c) if c.is_ascii_digit() || b"@*#?$!-".contains(&c) => {
                parts.push(Part::Opaque {
                    raw: self.s[self.i..self.i + 2].to_owned(),
                });
                self.i += 2;
            }
            _ => {
                push_lit(parts, "$", quoted);
                self.i += 1;
            }
        }
    }
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `${...}`: a plain name, or a name with a default operator; anything else is opaque.
fn brace(inner: &str, raw: &str, quoted: bool) -> Part {
    let name_len = inner
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        .map_or(inner.len(), |(k, _)| k);
    let name = &inner[..name_len];
    let opaque = || Part::Opaque {
        raw: raw.to_owned(),
    };
    if !valid_name(name) {
        return opaque();
    }
    let rest = &inner[name_len..];
    let default = if rest.is_empty() {
        None
    } else {
        let (colon, text) = if let Some(t) = rest.strip_prefix(":-").or(rest.strip_prefix(":=")) {
            (true, t)
        } else if let Some(t) = rest.strip_prefix('-').or(rest.strip_prefix('=')) {
            (false, t)
        } else {
            return opaque();
        };
        let simple = !text.contains(['$', '`', '\\', '\'', '"']);
        Some((colon, simple.then(|| text.to_owned())))
    };
    Part::Var {
        name: name.to_owned(),
        quoted,
        default,
    }
}

/// Reserved words skipped at the start of a command.
const PREFIX_WORDS: [&str; 10] = [
    "!", "if", "then", "elif", "else", "do", "while", "until", "{", "time",
];
/// Reserved words that make the rest of a command not a command.
const SKIP_WORDS: [&str; 9] = [
    "for", "case", "select", "function", "fi", "done", "esac", "}", "in",
];

fn plain(parts: &[Part]) -> Option<&str> {
    match parts {
        [
            Part::Lit {
                text,
                quoted: false,
            },
        ] => Some(text),
        _ => None,
    }
}

/// `NAME=value` as the first word: the name and the value's parts.
fn assignment(parts: &[Part]) -> Option<(String, Vec<Part>)> {
    let Some(Part::Lit {
        text,
        quoted: false,
    }) = parts.first()
    else {
        return None;
    };
    let (name, value) = text.split_once('=')?;
    if !valid_name(name) {
        return None;
    }
    let mut value_parts = Vec::with_capacity(parts.len());
    if !value.is_empty() {
        value_parts.push(Part::Lit {
            text: value.to_owned(),
            quoted: false,
        });
    }
    value_parts.extend(parts[1..].iter().cloned());
    Some((name.to_owned(), value_parts))
}

#[derive(Debug, Clone)]
struct ScriptVar {
    val: SVal,
    exported: bool,
}

/// Interpreter state while walking a script.
struct State<'e> {
    env: &'e Env<'e>,
    meter: &'e Meter<'e>,
    /// Variables the script set, by name (lookups and updates are logarithmic).
    vars: BTreeMap<Rc<str>, ScriptVar>,
    /// The environment of the script's commands: inherited changes, then the script's own.
    exports: Exports,
    cwd: Option<Rc<str>>,
}

fn sval_text(v: &SVal) -> Option<Cow<'_, str>> {
    match v {
        SVal::Known(s) => Some(Cow::Borrowed(s)),
        SVal::Unset => Some(Cow::Borrowed("")),
        SVal::Unknown => None,
    }
}

impl State<'_> {
    fn lookup(&self, name: &str) -> Option<Cow<'_, str>> {
        if let Some(v) = self.vars.get(name) {
            return sval_text(&v.val);
        }
        if let Some(v) = self.exports.get(name) {
            // Inherited from an outer script or a launcher.
            return sval_text(v);
        }
        match self.env.get(name) {
            Val::Known(v) => Some(v),
            // valueFrom, or absent: the image or the runtime may set it. Not known.
            Val::Unknown { .. } | Val::Absent => None,
        }
    }

    fn set(&mut self, name: &str, val: SVal, export: bool) {
        let (key, was_exported) = match self.vars.get_key_value(name) {
            Some((k, v)) => (Rc::clone(k), v.exported),
            None => (Rc::from(name), self.exports.get(name).is_some()),
        };
        let exported = export || was_exported || !matches!(self.env.get(name), Val::Absent);
        if exported {
            match self.exports.with(Rc::clone(&key), val.clone(), self.meter) {
                Some(e) => self.exports = e,
                // Past MAX_EXPORTS: the meter has recorded it and the container is refused.
                None => return,
            }
        }
        self.vars.insert(key, ScriptVar { val, exported });
    }

    /// Expand one word; with `split`, unquoted expansions are split on blanks into several fields.
    /// Every variable value inserted is charged to the meter; past a bound the word is unknown
    /// and keeps the reference as written.
    fn expand(&self, parts: &[Part], split: bool, out: &mut Vec<Word>) {
        let mut cur = Word::default();
        let mut started = false;
        for p in parts {
            match p {
                Part::Lit { text, .. } => {
                    cur.text.push_str(text);
                    started = true;
                }
                Part::Opaque { raw } => {
                    cur.text.push_str(raw);
                    cur.unknown = true;
                    started = true;
                }
                Part::Var {
                    name,
                    quoted,
                    default,
                } => {
                    let value: Option<Cow<'_, str>> = match (self.lookup(name), default) {
                        (Some(v), Some((true, d))) if v.is_empty() => {
                            d.as_deref().map(Cow::Borrowed)
                        }
                        (v, _) => v,
                    };
                    let value =
                        value.filter(|v| self.meter.expand(cur.text.len() + v.len(), v.len()));
                    match value {
                        None => {
                            cur.text.push('$');
                            cur.text.push_str(name);
                            cur.unknown = true;
                            started = true;
                        }
                        Some(v) if *quoted || !split => {
                            cur.text.push_str(&v);
                            started |= *quoted || !v.is_empty();
                        }
                        Some(v) => {
                            let blank = |c: char| matches!(c, ' ' | '\t' | '\n');
                            if v.starts_with(blank) && started {
                                out.push(std::mem::take(&mut cur));
                                started = false;
                            }
                            let mut first = true;
                            for piece in v.split(blank).filter(|s| !s.is_empty()) {
                                if !first {
                                    out.push(std::mem::take(&mut cur));
                                }
                                cur.text.push_str(piece);
                                started = true;
                                first = false;
                            }
                            if v.ends_with(blank) && started {
                                out.push(std::mem::take(&mut cur));
                                started = false;
                            }
                        }
                    }
                }
            }
        }
        if started {
            out.push(cur);
        }
    }

    fn expand_one(&self, parts: &[Part]) -> Word {
        let mut out = Vec::with_capacity(1);
        self.expand(parts, false, &mut out);
        out.pop().unwrap_or_default()
    }

    fn to_sval(w: Word) -> SVal {
        if w.unknown {
            SVal::Unknown
        } else {
            SVal::Known(Rc::from(w.text))
        }
    }

    /// `cd DIR`: the new working directory, when known. A relative `cd` builds a new path from
    /// the old one, so its bytes are charged like an expansion (`cd a` repeated would otherwise
    /// cost the square of the script's length).
    fn chdir(&self, dir: Option<&Word>) -> Option<Rc<str>> {
        match dir {
            Some(w) if !w.unknown && w.text.starts_with('/') => {
                Some(Rc::from(paths::clean(&w.text)))
            }
            Some(w) if !w.unknown && w.text != "-" => {
                let joined = paths::join(self.cwd.as_deref()?, &w.text);
                self.meter
                    .expand(joined.len(), joined.len())
                    .then(|| Rc::from(joined))
            }
            _ => None,
        }
    }

    fn command(&mut self, raw: &[Vec<Part>], out: &mut Vec<Command>) {
        let mut idx = 0;
        let mut prefix: Vec<(String, SVal)> = Vec::new();
        loop {
            if let Some(w) = raw.get(idx).and_then(|p| plain(p))
                && PREFIX_WORDS.contains(&w)
            {
                idx += 1;
                if w == "time" && raw.get(idx).and_then(|p| plain(p)) == Some("-p") {
                    idx += 1;
                }
                continue;
            }
            if let Some((name, value)) = raw.get(idx).and_then(|p| assignment(p)) {
                let v = self.expand_one(&value);
                prefix.push((name, Self::to_sval(v)));
                idx += 1;
                continue;
            }
            break;
        }
        if let Some(w) = raw.get(idx).and_then(|p| plain(p))
            && SKIP_WORDS.contains(&w)
        {
            return;
        }
        if idx >= raw.len() {
            for (name, val) in prefix {
                self.set(&name, val, false);
            }
            return;
        }
        let mut words = Vec::with_capacity(raw.len() - idx);
        for parts in &raw[idx..] {
            self.expand(parts, true, &mut words);
        }
        let Some(first) = words.first() else {
            return;
        };
        match (first.unknown, first.text.as_str()) {
            (false, "export" | "declare" | "typeset" | "readonly" | "local") => {
                let export = first.text == "export"
                    || raw[idx + 1..]
                        .iter()
                        .any(|p| plain(p).is_some_and(|w| w.starts_with('-') && w.contains('x')));
                for parts in &raw[idx + 1..] {
                    if let Some((name, value)) = assignment(parts) {
                        let v = self.expand_one(&value);
                        self.set(&name, Self::to_sval(v), export);
                    } else if export && let Some(name) = plain(parts).filter(|n| valid_name(n)) {
                        let val = self
                            .vars
                            .get(name)
                            .filter(|v| !v.exported)
                            .map(|v| v.val.clone());
                        if let Some(val) = val {
                            self.set(name, val, true);
                        }
                    }
                }
            }
            (false, "unset") => {
                for w in &words[1..] {
                    if !w.unknown && valid_name(&w.text) {
                        self.set(&w.text, SVal::Unset, false);
                    }
                }
            }
            (false, "cd") => {
                self.cwd = self.chdir(words.get(1));
            }
            _ => {
                if !self.meter.command() {
                    return;
                }
                let mut overrides = self.exports.clone();
                for (name, val) in prefix {
                    match overrides.with(Rc::from(name), val, self.meter) {
                        Some(e) => overrides = e,
                        None => return,
                    }
                }
                out.push(Command {
                    words,
                    overrides,
                    cwd: self.cwd.clone(),
                });
            }
        }
    }
}

/// The simple commands `script` runs, in order. `inherited` are environment changes made by the
/// caller (an outer script, a launcher), `cwd` the working directory when known. Work is charged
/// to `meter`; once it records a bound, reading stops (the caller must then not trust the
/// commands).
pub(crate) fn parse(
    script: &str,
    env: &Env<'_>,
    meter: &Meter<'_>,
    inherited: &Exports,
    cwd: Option<Rc<str>>,
) -> Vec<Command> {
    let mut state = State {
        env,
        meter,
        vars: BTreeMap::new(),
        exports: inherited.clone(),
        cwd,
    };
    let mut out = Vec::new();
    let mut raw: Vec<Vec<Part>> = Vec::new();
    let mut lexer = Lexer::new(script);
    while let Some(tok) = lexer.next_tok() {
        if meter.hit().is_some() {
            return out;
        }
        match tok {
            Tok::Word(parts) => raw.push(parts),
            Tok::Sep => {
                state.command(&raw, &mut out);
                raw.clear();
            }
        }
    }
    state.command(&raw, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Bound, Budget, MAX_EXPORTS};
    use k8s_openapi::api::core::v1::{Container, EnvVar};

    fn meter() -> &'static Meter<'static> {
        Box::leak(Box::new(Meter::new(Box::leak(Box::new(Budget::default())))))
    }

    fn run(script: &str, e: &Env<'_>) -> Vec<Command> {
        parse(script, e, meter(), &Exports::default(), None)
    }

    fn env(vars: &[(&str, &str)]) -> Env<'static> {
        let c = Container {
            name: "c".into(),
            env: Some(
                vars.iter()
                    .map(|(n, v)| EnvVar {
                        name: (*n).into(),
                        value: Some((*v).into()),
                        value_from: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        Env::of(Box::leak(Box::new(c)), "spec.containers[0]", meter())
    }

    fn texts(cmds: &[Command]) -> Vec<Vec<String>> {
        cmds.iter()
            .map(|c| c.words.iter().map(|w| w.text.clone()).collect())
            .collect()
    }

    #[test]
    fn operators_redirections_and_background() {
        let e = env(&[]);
        let cmds = run(
            "vllm serve --model Qwen/Qwen2.5-32B-Instruct --tensor-parallel-size 4 > /vllm.out 2>&1 &",
            &e,
        );
        assert_eq!(
            texts(&cmds),
            vec![vec![
                "vllm",
                "serve",
                "--model",
                "Qwen/Qwen2.5-32B-Instruct",
                "--tensor-parallel-size",
                "4"
            ]]
        );
        let cmds = run("a && b || c; d | e |& f\ng &>/dev/null; h 2> x <in", &e);
        assert_eq!(
            texts(&cmds),
            vec![
                vec!["a"],
                vec!["b"],
                vec!["c"],
                vec!["d"],
                vec!["e"],
                vec!["f"],
                vec!["g"],
                vec!["h"]
            ]
        );
    }

    #[test]
    fn quotes_and_escapes() {
        let e = env(&[("A", "x y")]);
        let cmds = run(
            r#"p 'a b' "c $A" d\ e "q\"x" '' "" $A "${A}" 'no $A' a"b"c"#,
            &e,
        );
        assert_eq!(
            texts(&cmds),
            vec![vec![
                "p", "a b", "c x y", "d e", "q\"x", "", "", "x", "y", "x y", "no $A", "abc"
            ]]
        );
    }

    #[test]
    fn unknown_expansions_are_marked() {
        let e = env(&[("KNOWN", "/m")]);
        let cmds = run(
            "vllm serve $MODEL --x $(cat f) `id` $1 ${KNOWN%/} ${KNOWN} ${NOPE:-d} ${EMPTY:-d}",
            &e,
        );
        let w = &cmds[0].words;
        assert!(w[2].unknown && w[2].text == "$MODEL");
        assert!(w[4].unknown);
        assert!(w[5].unknown);
        assert!(w[6].unknown);
        assert!(w[7].unknown, "operators other than defaults are opaque");
        assert!(!w[8].unknown && w[8].text == "/m");
        assert!(
            w[9].unknown,
            "unset-or-image-env variable with default is not known"
        );
        let e = env(&[("EMPTY", "")]);
        let cmds = run("x ${EMPTY:-d} ${EMPTY-d}", &e);
        assert_eq!(texts(&cmds), vec![vec!["x", "d"]]);
    }

    #[test]
    fn assignments_exports_and_cd() {
        let e = env(&[("HF_HOME", "/a")]);
        let cmds = run(
            "M=org/m; export HF_HOME=/b; cd /work && X=1 hf download $M --local-dir ./d; cd sub; run",
            &e,
        );
        assert_eq!(
            texts(&cmds),
            vec![
                vec!["hf", "download", "org/m", "--local-dir", "./d"],
                vec!["run"]
            ]
        );
        let c = &cmds[0];
        assert_eq!(c.cwd.as_deref(), Some("/work"));
        assert_eq!(c.overrides.get("HF_HOME"), Some(&SVal::known("/b")));
        assert_eq!(c.overrides.get("X"), Some(&SVal::known("1")));
        assert!(c.overrides.get("M").is_none(), "M is not exported");
        assert_eq!(cmds[1].cwd.as_deref(), Some("/work/sub"));
    }

    #[test]
    fn reserved_words_comments_heredocs() {
        let e = env(&[]);
        let script = "# fetch\nif [ ! -f /m/done ]; then\n  hf download a/b # trailing\nfi\ncat <<EOF > /x\nvllm serve nope\nEOF\nfor i in 1 2; do run $i; done\n";
        let cmds = run(script, &e);
        let t = texts(&cmds);
        assert_eq!(t[0], vec!["[", "!", "-f", "/m/done", "]"]);
        assert_eq!(t[1], vec!["hf", "download", "a/b"]);
        assert_eq!(t[2], vec!["cat"]);
        assert_eq!(t[3], vec!["run", "$i"]);
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn never_panics_on_odd_input() {
        let e = env(&[]);
        for s in [
            "",
            "'",
            "\"",
            "${",
            "$(",
            "$((1+",
            "`",
            "\\",
            "a\\",
            "<<",
            "2>",
            "&>",
            "${A:-",
            "\"$",
            "é'ü\"ß$ä",
            "((((",
            "))))",
            "<<-X\n\tX\n",
            "a=(",
            "${!x}",
            "$",
            "\"\\",
        ] {
            let _ = run(s, &e);
        }
    }

    #[test]
    fn doubling_is_unknown_past_the_bound() {
        let e = env(&[]);
        let m = meter();
        let mut script = String::from("A=x\n");
        for _ in 0..64 {
            script.push_str("A=$A$A\n");
        }
        script.push_str("echo \"$A\"\n");
        let cmds = parse(&script, &e, m, &Exports::default(), None);
        assert!(cmds.is_empty(), "reading stops at the bound");
        assert_eq!(m.hit(), Some((Bound::ValueBytes, None)));
    }

    #[test]
    fn exports_are_shared_not_copied() {
        let e = env(&[]);
        let m = meter();
        let mut script = String::new();
        for i in 0..100 {
            script.push_str(&format!("export V{i}=x{i}; run {i}; "));
        }
        let cmds = parse(&script, &e, m, &Exports::default(), None);
        assert_eq!(cmds.len(), 100);
        assert_eq!(cmds[0].overrides.get("V0"), Some(&SVal::known("x0")));
        assert!(cmds[0].overrides.get("V1").is_none());
        assert_eq!(cmds[99].overrides.get("V0"), Some(&SVal::known("x0")));
        assert_eq!(cmds[99].overrides.get("V99"), Some(&SVal::known("x99")));
        assert_eq!(m.hit(), None);
        let m = meter();
        let script = "export A=1; ".repeat(MAX_EXPORTS + 1) + "run";
        let cmds = parse(&script, &e, m, &Exports::default(), None);
        assert!(cmds.is_empty());
        assert_eq!(m.hit(), Some((Bound::Exports, None)));
    }

    #[test]
    fn relative_cd_is_charged() {
        let e = env(&[]);
        let m = meter();
        let script = format!("cd /w; {}run", "cd a; ".repeat(10_000));
        let cmds = parse(&script, &e, m, &Exports::default(), None);
        assert!(cmds.is_empty());
        assert_eq!(m.hit(), Some((Bound::ExpansionBytes, None)));
        let cmds = run("cd /w; cd a; cd ../b; run", &e);
        assert_eq!(cmds[0].cwd.as_deref(), Some("/w/b"));
    }
}
