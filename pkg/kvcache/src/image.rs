//! Container image references and the pull policy that follows from the tag.
//!
//! A reference is admitted only when both grammars that decide its fate take it:
//!
//! - the upstream operator's admission parser (go-containerregistry's `name.ParseReference`):
//!   the repository (without a registry, which it recognises by a `.` or `:` in the first
//!   component) is 2 to 255 characters of `a-z 0-9 _ - . /`, the registry a URI authority, a
//!   tag 1 to 128 of `A-Z a-z 0-9 _ - .`, and a digest exactly `sha256:` with 64 lower-case
//!   hexadecimal digits;
//! - the kubelet's (the distribution reference grammar, which it refuses a Pod's image by with
//!   `InvalidImageName`): `[domain[:port]/]component(/component)*[:tag][@digest]`, components
//!   `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, the domain `[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?`
//!   labels joined by `.` (or an IPv6 address in brackets) with an optional numeric port, the
//!   whole name at most 255 characters, a tag `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
//!
//! The first component is the domain when it contains `.` or `:`, is `localhost`, or holds an
//! upper-case letter (the kubelet's rule); the upstream parser does not take an upper-case one
//! as a registry, so `Registry/repo` is refused.

use warmcache_api_kvcache::v1alpha1::ImagePullPolicy;
use warmcache_cli::text::shown;

/// The parts of an image reference this crate needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host (and port), when the reference names one.
    pub domain: Option<String>,
    /// Repository path.
    pub path: String,
    /// Tag, when given.
    pub tag: Option<String>,
    /// Digest (`sha256:hex`), when given.
    pub digest: Option<String>,
}

/// Longest repository name (domain and path) the reference grammar allows.
const MAX_NAME_LENGTH: usize = 255;
/// Shortest repository path (without the registry) the upstream parser allows.
const MIN_REPOSITORY_LENGTH: usize = 2;
/// Longest tag.
const MAX_TAG_LENGTH: usize = 128;
/// Hexadecimal digits of a sha256 digest.
const SHA256_HEX_LENGTH: usize = 64;

/// Reads an image reference, or says why it is not one. The reference is read as written:
/// `spec.image` is trimmed by its caller first, a member group's image is not (upstream renders
/// it verbatim).
pub fn parse(reference: &str) -> Result<ImageRef, String> {
    if reference.is_empty() {
        return Err("it is empty".into());
    }
    if let Some(c) = reference
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "it contains the character {}",
            shown(&c.to_string())
        ));
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => {
            check_digest(digest)?;
            (rest, Some(digest.to_owned()))
        }
        None => (reference, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => {
            let at = last_slash + i;
            let tag = &rest[at + 1..];
            check_tag(tag)?;
            (&rest[..at], Some(tag.to_owned()))
        }
        None => (rest, None),
    };
    if name.is_empty() {
        return Err("it names no repository".into());
    }
    if name.len() > MAX_NAME_LENGTH {
        return Err(format!(
            "its repository name is {} characters long, and at most {MAX_NAME_LENGTH} are allowed",
            name.len()
        ));
    }
    // The upstream parser's view: a registry only when the first component has '.' or ':'.
    let repository = match name.split_once('/') {
        Some((first, path)) if first.contains(['.', ':']) => path,
        _ => name,
    };
    if repository.len() < MIN_REPOSITORY_LENGTH {
        return Err(format!(
            "its repository {} is shorter than {MIN_REPOSITORY_LENGTH} characters",
            shown(repository)
        ));
    }
    if let Some(c) = repository.chars().find(|c| {
        !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.' | '/'))
    }) {
        return Err(format!(
            "its repository {} contains {}: a repository is lower-case letters, digits, '_', '-', '.' \
             and '/' (a registry is told apart by a '.' or ':' in its name)",
            shown(repository),
            shown(&c.to_string())
        ));
    }
    // The kubelet's view.
    let (domain, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            check_domain(first)?;
            (Some(first.to_owned()), path)
        }
        _ => (None, name),
    };
    for component in path.split('/') {
        check_path_component(component)?;
    }
    Ok(ImageRef {
        domain,
        path: path.to_owned(),
        tag,
        digest,
    })
}

fn check_digest(digest: &str) -> Result<(), String> {
    let hex = digest.strip_prefix("sha256:").ok_or_else(|| {
        format!(
            "its digest {} is not sha256:<64 hexadecimal digits>, the only digest the upstream parser takes",
            shown(digest)
        )
    })?;
    if hex.len() != SHA256_HEX_LENGTH
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "its digest {} must carry exactly {SHA256_HEX_LENGTH} lower-case hexadecimal digits after sha256:",
            shown(digest)
        ));
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok = tag.len() <= MAX_TAG_LENGTH
        && tag.chars().next().is_some_and(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "its tag {} is not valid: a tag is 1 to {MAX_TAG_LENGTH} letters, digits, '_', '.' and '-', \
             not starting with '.' or '-'",
            shown(tag)
        ))
    }
}

fn check_domain(domain: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return Err(format!(
                "its registry {} opens '[' without closing it",
                shown(domain)
            ));
        };
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "its registry {} is not an IPv6 address in brackets",
                shown(domain)
            ));
        }
        match after {
            "" => (None, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => {
                    return Err(format!("its registry {} is not host[:port]", shown(domain)));
                }
            },
        }
    } else {
        match domain.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(domain), None),
        }
    };
    if let Some(host) = host {
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-')
                && !c.starts_with('-')
                && !c.ends_with('-')
        };
        if !host.split('.').all(component_ok) {
            return Err(format!(
                "its registry host {} is not a host name",
                shown(host)
            ));
        }
    }
    if let Some(port) = port
        && (port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(format!("its registry port {} is not a number", shown(port)));
    }
    Ok(())
}

fn check_path_component(component: &str) -> Result<(), String> {
    let problem = || {
        Err(format!(
            "its repository path component {} is not valid: components are lower-case \
             letters and digits, separated by '.', '_', '__' or dashes",
            shown(component)
        ))
    };
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = component.as_bytes();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return problem();
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator: one '.', one or two '_', or any number of '-'.
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return problem(),
        }
        if i == start || i >= bytes.len() || !alnum(bytes[i]) {
            return problem();
        }
    }
    Ok(())
}

/// The pull policy of `image`: `explicit` when the backend sets one, else `Always` for an image
/// tagged `latest` or carrying neither tag nor digest, `IfNotPresent` otherwise (the kubelet's
/// own default). An unreadable reference gets `IfNotPresent`; the validator refuses it anyway.
pub fn pull_policy(image: &str, explicit: Option<ImagePullPolicy>) -> &'static str {
    if let Some(policy) = explicit {
        return match policy {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        };
    }
    match parse(image) {
        Ok(ImageRef { tag: Some(tag), .. }) if tag == "latest" => "Always",
        Ok(ImageRef {
            tag: None,
            digest: None,
            ..
        }) => "Always",
        _ => "IfNotPresent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_references() {
        let r = parse("docker.io/kvcacheai/mooncake:0.3.13").unwrap();
        assert_eq!(r.domain.as_deref(), Some("docker.io"));
        assert_eq!(r.path, "kvcacheai/mooncake");
        assert_eq!(r.tag.as_deref(), Some("0.3.13"));
        let r = parse("localhost:5000/store").unwrap();
        assert_eq!(r.domain.as_deref(), Some("localhost:5000"));
        assert_eq!(r.tag, None);
        assert!(parse("mooncake").is_ok());
        assert!(parse("a/b__c/d-e--f.g:tag_1.2-3").is_ok());
        assert!(parse(&format!("repo@sha256:{}", "a".repeat(64))).is_ok());
        assert!(parse(&format!("repo:1@sha256:{}", "a".repeat(64))).is_ok());
        assert!(parse("[::1]:5000/repo:x").is_ok());
        // Examples of the distribution grammar's own tests.
        for good in [
            "test_com",
            "test.com:tag",
            "test.com:5000",
            "test.com/repo:tag",
            "test:5000/repo",
            "test:5000/repo:tag",
            "lowercase:Uppercase",
            "sub-dom1.foo.com/bar/baz/quux",
            "sub-dom1.foo.com/bar/baz/quux:some-long-tag",
            "b.gcr.io/test.example.com/my-app:test.example.com",
            "xn--n3h.com/myimage:xn--n3h.com",
            "foo_bar.com:8080",
            "foo/foo_bar.com:8080",
            "192.168.1.1/bar",
            "192.168.1.1:5/bar",
            "[2001:db8::1]/repo",
            "[2001:db8::1]:5000/repo",
            "a/a",
            "ab",
        ] {
            assert!(parse(good).is_ok(), "{good:?} must be admitted");
        }
        let r = parse(&format!("test:5000/repo@sha256:{}", "f".repeat(64))).unwrap();
        assert_eq!(r.domain.as_deref(), Some("test:5000"));
        assert_eq!(r.path, "repo");
    }

    #[test]
    fn upstream_refusals_the_kubelet_would_take() {
        for bad in [
            // A one-character repository (upstream: 2 to 255 characters).
            "a",
            "docker.io/a",
            // A registry the upstream parser does not see as one, so its repository has an
            // upper-case letter.
            "Registry/repo",
            // Digests other than sha256 with exactly 64 lower-case hexadecimal digits.
            &format!("repo@sha512:{}", "a".repeat(128)),
            &format!("repo@sha256:{}", "a".repeat(32)),
            &format!("repo@sha256:{}", "A".repeat(64)),
            &format!("repo@sha256:{}", "a".repeat(65)),
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn refused_references() {
        for bad in [
            "",
            "Mooncake",
            "repo:",
            "repo:-x",
            "repo@sha256:abc",
            "re po",
            "docker.io/",
            "docker.io//x",
            "a/.b",
            "a/b-",
            "repo:tag:more",
            "host:port/x",
            "-host.io/x",
            // The distribution grammar's own refusals.
            "aa/asdf$$^/aa",
            "[2001:db8::1]",
            "[2001:db8::1]:5000",
            "[fe80::1%eth0]:5000/repo",
            &format!("{}/{}", "a".repeat(128), "b".repeat(128)),
            &format!("repo:{}", "t".repeat(129)),
            "foo_bar.io/x",
            " repo:1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn pull_policies() {
        assert_eq!(pull_policy("repo:latest", None), "Always");
        assert_eq!(pull_policy("repo", None), "Always");
        assert_eq!(pull_policy("repo:1.0", None), "IfNotPresent");
        assert_eq!(
            pull_policy(&format!("repo@sha256:{}", "a".repeat(64)), None),
            "IfNotPresent"
        );
        assert_eq!(
            pull_policy("repo:1.0", Some(ImagePullPolicy::Always)),
            "Always"
        );
        assert_eq!(pull_policy("repo", Some(ImagePullPolicy::Never)), "Never");
    }
}
