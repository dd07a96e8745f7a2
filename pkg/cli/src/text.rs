//! Safe pieces of messages: values that a user (or an attacker) wrote are shown bounded in size
//! and with every invisible character escaped, so a refusal can neither flood a terminal, an
//! admission response or an Event, nor hide what it names.

use std::fmt::Write as _;

/// Longest value, in characters, that [`shown`] prints whole.
pub const SHOWN_CHARS: usize = 120;

/// Characters of a longer value that [`shown`] keeps (the rest is summarised by its length).
const SHOWN_PREFIX_CHARS: usize = 64;

/// Whether `c` is invisible or changes how the text around it is displayed: control
/// characters, Unicode format characters (zero-width spaces and joiners, bidirectional
/// overrides and isolates, the byte-order mark, tag characters), and separators other than the
/// plain space.
pub fn is_invisible(c: char) -> bool {
    if c.is_control() {
        return true;
    }
    matches!(
        c,
        '\u{00A0}'
            | '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{1680}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{2000}'..='\u{200F}'
            | '\u{2028}'..='\u{202F}'
            | '\u{205F}'..='\u{206F}'
            | '\u{3000}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c => {
            let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
        }
    }
}

/// `s` with every [invisible](is_invisible) character written as an escape (`\n`, `\t`,
/// `\u{200b}`) and backslashes doubled, so two different strings never look the same. For field
/// paths and names, which are printed without quotes.
pub fn escape(s: &str) -> String {
    if !s.chars().any(|c| c == '\\' || is_invisible(c)) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if is_invisible(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out
}

/// A field path for a message: escaped as [`escape`] does, and bounded like [`shown`] (a map key
/// in a path is user input too).
pub fn path(p: &str) -> String {
    let chars = p.chars().count();
    if chars <= SHOWN_CHARS * 2 {
        return escape(p);
    }
    let head: String = p.chars().take(SHOWN_CHARS).collect();
    format!("{}...({} bytes)", escape(&head), p.len())
}

/// A user-written value for a message: quoted, with quotes, backslashes and invisible
/// characters escaped; a value longer than [`SHOWN_CHARS`] characters is cut after its first
/// characters and marked with its full length in bytes, so the reader knows it was cut.
pub fn shown(value: &str) -> String {
    let chars = value.chars().count();
    let (body, cut) = if chars <= SHOWN_CHARS {
        (value, false)
    } else {
        let end = value
            .char_indices()
            .nth(SHOWN_PREFIX_CHARS)
            .map_or(value.len(), |(i, _)| i);
        (&value[..end], true)
    };
    let mut out = String::with_capacity(body.len() + 24);
    out.push('"');
    for c in body.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if is_invisible(c) => push_escaped(&mut out, c),
            c => out.push(c),
        }
    }
    out.push('"');
    if cut {
        let _ = write!(out, "...({} bytes in all)", value.len());
    }
    out
}

/// At most `max` bytes of `s`, cut at a character boundary, with a note of the length cut; for
/// texts that are already messages (a parser's error, say) and may quote the input at length.
pub fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...({} bytes in all)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_quoted_whole() {
        assert_eq!(shown("nginx:1.27"), "\"nginx:1.27\"");
        assert_eq!(shown("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn long_values_are_cut_with_their_length() {
        let v = "x".repeat(120_000);
        let s = shown(&v);
        assert!(s.len() < 120, "{s}");
        assert!(s.ends_with("...(120000 bytes in all)"), "{s}");
        assert!(s.starts_with(&format!("\"{}", "x".repeat(64))), "{s}");
        // Exactly at the bound: whole.
        let v = "y".repeat(SHOWN_CHARS);
        assert_eq!(shown(&v), format!("\"{v}\""));
    }

    #[test]
    fn cutting_respects_character_boundaries() {
        let v = "é".repeat(500);
        let s = shown(&v);
        assert!(s.ends_with("...(1000 bytes in all)"), "{s}");
        assert_eq!(bounded(&v, 3), "é...(1000 bytes in all)");
        assert_eq!(bounded("short", 10), "short");
    }

    #[test]
    fn invisible_characters_are_escaped() {
        assert_eq!(escape("spec.a\u{200b}b"), "spec.a\\u{200b}b");
        assert_eq!(escape("x\ny\tz"), "x\\ny\\tz");
        assert_eq!(escape("bidi\u{202e}"), "bidi\\u{202e}");
        assert_eq!(escape("tag\u{e0041}"), "tag\\u{e0041}");
        assert_eq!(escape("nbsp\u{a0}"), "nbsp\\u{00a0}");
        assert_eq!(escape("bom\u{feff}"), "bom\\u{feff}");
        assert_eq!(escape("plain path[0].name"), "plain path[0].name");
        assert_eq!(shown("a\u{7}b"), "\"a\\u{0007}b\"");
    }

    #[test]
    fn escaping_is_unambiguous() {
        // A literal backslash-u sequence cannot pass for an escaped character.
        assert_ne!(escape("a\\u{200b}"), escape("a\u{200b}"));
        assert_eq!(escape("a\\b"), "a\\\\b");
    }

    #[test]
    fn long_paths_are_bounded() {
        let p = format!("spec.{}", "k".repeat(10_000));
        let s = path(&p);
        assert!(s.len() < 200, "{s}");
        assert!(s.ends_with("...(10005 bytes)"), "{s}");
    }

    #[test]
    fn visible_unicode_is_kept() {
        assert!(!is_invisible('é'));
        assert!(!is_invisible('模'));
        assert!(!is_invisible(' '));
        assert_eq!(escape("模型"), "模型");
    }
}
