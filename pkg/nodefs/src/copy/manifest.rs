//! The manifest: one `sha256sum`-compatible line per regular file, sorted by path.
//!
//! A line is `<64 lowercase hex>  <path>\n`. A path holding a backslash, newline or carriage
//! return is written as `sha256sum` (GNU coreutils 9) writes it: the line starts with `\` and
//! those three are escaped as `\\`, `\n` and `\r`. So a file name holding a newline cannot forge
//! a line, and `cd <root> && sha256sum -c .nvsnap-manifest` checks a volume.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Error;

/// SHA-256 digests by path relative to the root (bytes, `/`-separated).
pub(crate) type Digests = BTreeMap<Vec<u8>, [u8; 32]>;

/// The largest manifest read back (about half a million files).
pub(crate) const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// The manifest text of `files`.
pub(crate) fn format(files: &Digests) -> Vec<u8> {
    let mut out = Vec::with_capacity(files.len() * 128);
    for (path, digest) in files {
        let escape = path.iter().any(|b| matches!(b, b'\\' | b'\n' | b'\r'));
        if escape {
            out.push(b'\\');
        }
        out.extend_from_slice(hex::encode(digest).as_bytes());
        out.extend_from_slice(b"  ");
        if escape {
            for &b in path {
                match b {
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b => out.push(b),
                }
            }
        } else {
            out.extend_from_slice(path);
        }
        out.push(b'\n');
    }
    out
}

/// Parses a manifest this crate wrote. Strict: every line terminated, lowercase hex, two spaces,
/// plain relative paths (no empty, `.` or `..` component, no leading `/`), sorted by path with no
/// duplicates. `path` is the manifest's own path, for messages.
pub(crate) fn parse(text: &[u8], path: &Path) -> Result<Digests, Error> {
    let err = |line: usize, reason: &'static str| Error::Manifest {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut out = Digests::new();
    if text.is_empty() {
        return Ok(out);
    }
    let Some(body) = text.strip_suffix(b"\n") else {
        return Err(err(
            text.split(|&b| b == b'\n').count(),
            "last line is not terminated",
        ));
    };
    let mut last: Option<Vec<u8>> = None;
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        let (escaped, line) = match line.strip_prefix(b"\\") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let (Some(hex_part), Some(sep), Some(name)) =
            (line.get(..64), line.get(64..66), line.get(66..))
        else {
            return Err(err(n, "too short for a digest, two spaces and a path"));
        };
        if !hex_part
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            return Err(err(n, "the digest is not 64 lowercase hex digits"));
        }
        if sep != b"  " {
            return Err(err(n, "the digest is not followed by two spaces"));
        }
        let name = if escaped {
            unescape(name)
                .ok_or_else(|| err(n, "invalid escape in the path (only \\\\, \\n and \\r)"))?
        } else {
            name.to_vec()
        };
        if !plain_relative(&name) {
            return Err(err(n, "the path is not a plain relative path"));
        }
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut digest).map_err(|_| err(n, "the digest is not hex"))?;
        if let Some(prev) = &last {
            if *prev == name {
                return Err(err(n, "the path is listed twice"));
            }
            if *prev > name {
                return Err(err(n, "the lines are not sorted by path"));
            }
        }
        last = Some(name.clone());
        out.insert(name, digest);
    }
    Ok(out)
}

fn unescape(name: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len());
    let mut it = name.iter();
    while let Some(&b) = it.next() {
        if b == b'\\' {
            match it.next() {
                Some(b'\\') => out.push(b'\\'),
                Some(b'n') => out.push(b'\n'),
                Some(b'r') => out.push(b'\r'),
                _ => return None,
            }
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// Non-empty, no leading `/`, no empty, `.` or `..` component, no NUL.
fn plain_relative(path: &[u8]) -> bool {
    !path.is_empty()
        && !path.contains(&0)
        && path
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn digests(paths: &[&[u8]]) -> Digests {
        paths
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_vec(), [u8::try_from(i).unwrap(); 32]))
            .collect()
    }

    #[test]
    fn plain_and_escaped_lines() {
        let d = digests(&[b"a b/c.json", b"x\ny", b"back\\slash", b"cr\rx"]);
        let text = format(&d);
        let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
        // Four lines and the empty rest after the last newline: a newline in a name cannot add one.
        assert_eq!(lines.len(), 5);
        assert!(
            lines
                .iter()
                .any(|l| l.ends_with(b"  a b/c.json") && !l.starts_with(b"\\"))
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(b"\\") && l.ends_with(b"  x\\ny"))
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(b"\\") && l.ends_with(b"  back\\\\slash"))
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(b"\\") && l.ends_with(b"  cr\\rx"))
        );
        assert_eq!(parse(&text, Path::new("m")).unwrap(), d);
    }

    #[test]
    fn a_newline_in_a_name_cannot_forge_a_line() {
        let forged = format!("x\n{}  victim", "0".repeat(64));
        let d = digests(&[forged.as_bytes()]);
        let text = format(&d);
        assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1);
        let back = parse(&text, Path::new("m")).unwrap();
        assert_eq!(back.len(), 1);
        assert!(back.contains_key(forged.as_bytes()));
    }

    #[test]
    fn refuses_what_the_copier_never_writes() {
        let h = "ab".repeat(32);
        let cases: Vec<(String, usize, &str)> = vec![
            (format!("{h}  a"), 1, "not terminated"),
            (format!("{h}  a\n{h} b\n"), 2, "two spaces"),
            (format!("{}  a\n", "AB".repeat(32)), 1, "lowercase hex"),
            (format!("{h}  b\n{h}  a\n"), 2, "not sorted"),
            (format!("{h}  a\n{h}  a\n"), 2, "twice"),
            (format!("{h}  ../etc/passwd\n"), 1, "plain relative"),
            (format!("{h}  /etc/passwd\n"), 1, "plain relative"),
            (format!("{h}  a//b\n"), 1, "plain relative"),
            (format!("{h}  \n"), 1, "plain relative"),
            (format!("\\{h}  a\\tb\n"), 1, "escape"),
            (format!("{h}\n"), 1, "too short"),
        ];
        for (text, line, reason) in cases {
            let e = parse(text.as_bytes(), Path::new("/v/.nvsnap-manifest")).unwrap_err();
            match &e {
                Error::Manifest {
                    line: l, reason: r, ..
                } => {
                    assert_eq!(*l, line, "{text:?}: {e}");
                    assert!(r.contains(reason), "{text:?}: {e}");
                }
                other => panic!("{other}"),
            }
        }
        assert!(parse(b"", Path::new("m")).unwrap().is_empty());
    }

    proptest! {
        #[test]
        fn round_trips(names in proptest::collection::btree_set(
            proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'\\'), Just(b'\n'), Just(b'\r'), Just(b' '), Just(0xffu8), Just(b'/')], 1..12), 0..8)) {
            let d: Digests = names.into_iter().filter(|n| plain_relative(n)).map(|n| (n, [7u8; 32])).collect();
            let text = format(&d);
            prop_assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), d.len());
            prop_assert_eq!(parse(&text, Path::new("m")).unwrap(), d);
        }
    }
}
