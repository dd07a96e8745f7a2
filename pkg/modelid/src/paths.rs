//! Slash-separated path helpers with the semantics of Go's `path.Clean` (lexical only; no symlinks).

/// The shortest lexically equivalent path: repeated slashes collapsed, `.` removed, `..` resolved
/// against the preceding element (and dropped at the root of an absolute path). `""` becomes `.`.
pub fn clean(p: &str) -> String {
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    }
}

/// Whether clean absolute path `p` is `dir` or lies below it (both already cleaned).
pub fn is_within(p: &str, dir: &str) -> bool {
    if dir == "/" {
        return p.starts_with('/');
    }
    p == dir || (p.starts_with(dir) && p.as_bytes().get(dir.len()) == Some(&b'/'))
}

/// The part of clean path `p` below `dir` (`""` when equal); `None` when `p` is not within `dir`.
pub fn strip_dir<'a>(p: &'a str, dir: &str) -> Option<&'a str> {
    if !is_within(p, dir) {
        return None;
    }
    if dir == "/" {
        return Some(p.trim_start_matches('/'));
    }
    Some(p[dir.len()..].trim_start_matches('/'))
}

/// `base` joined with relative `rel`, cleaned.
pub fn join(base: &str, rel: &str) -> String {
    if rel.is_empty() {
        return clean(base);
    }
    clean(&format!("{base}/{rel}"))
}

/// The parent directory of a path (Go's `path.Dir`): `/a/b` -> `/a`, `/a` -> `/`, `a` -> `.`.
pub fn parent(p: &str) -> String {
    let c = clean(p);
    match c.rfind('/') {
        Some(0) => "/".to_owned(),
        Some(i) => c[..i].to_owned(),
        None => ".".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_matches_go_path_clean() {
        for (input, want) in [
            ("", "."),
            ("/", "/"),
            ("//a//b/", "/a/b"),
            ("/a/./b/../c", "/a/c"),
            ("/../a", "/a"),
            ("a/../..", ".."),
            ("./a", "a"),
            ("/config/models/", "/config/models"),
        ] {
            assert_eq!(clean(input), want, "clean({input:?})");
        }
    }

    #[test]
    fn within_respects_component_boundaries() {
        assert!(is_within("/models/llama", "/models"));
        assert!(is_within("/models", "/models"));
        assert!(!is_within("/models2", "/models"));
        assert!(is_within("/x", "/"));
        assert_eq!(strip_dir("/models/llama/x", "/models"), Some("llama/x"));
        assert_eq!(strip_dir("/models", "/models"), Some(""));
        assert_eq!(strip_dir("/a", "/"), Some("a"));
        assert_eq!(strip_dir("/b", "/a"), None);
    }

    #[test]
    fn parent_and_join() {
        assert_eq!(parent("/config/models/nemotron"), "/config/models");
        assert_eq!(parent("/a"), "/");
        assert_eq!(parent("a"), ".");
        assert_eq!(join("/models", "llama/../x"), "/models/x");
        assert_eq!(join("/models", ""), "/models");
    }
}
