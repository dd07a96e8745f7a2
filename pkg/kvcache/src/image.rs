//! Container image references: the grammar the kubelet parses (`[registry[:port]/]path[:tag][@digest]`)
//! and the pull policy that follows from the tag.

use warmcache_api_kvcache::v1alpha1::ImagePullPolicy;

/// The parts of an image reference this crate needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host (and port), when the reference names one.
    pub domain: Option<String>,
    /// Repository path.
    pub path: String,
    /// Tag, when given.
    pub tag: Option<String>,
    /// Digest (`algorithm:hex`), when given.
    pub digest: Option<String>,
}

/// Longest repository name (domain and path) the reference grammar allows.
const MAX_NAME_LENGTH: usize = 255;

/// Reads an image reference, or says why it is not one.
pub fn parse(reference: &str) -> Result<ImageRef, String> {
    if reference.is_empty() {
        return Err("it is empty".into());
    }
    if let Some(c) = reference
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!("it contains the character {c:?}"));
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
    let (domain, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains('.')
                || first.contains(':')
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
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(format!("its digest {digest:?} is not algorithm:hex"));
    };
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.split(['+', '.', '-', '_']).all(|part| {
            part.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && part.chars().all(|c| c.is_ascii_alphanumeric())
        });
    if !algorithm_ok {
        return Err(format!("its digest algorithm {algorithm:?} is not valid"));
    }
    if hex.len() < 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "its digest {digest:?} must carry at least 32 hexadecimal digits"
        ));
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok = tag.len() <= 128
        && tag.chars().next().is_some_and(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "its tag {tag:?} is not valid: a tag is 1 to 128 letters, digits, '_', '.' and '-', \
             not starting with '.' or '-'"
        ))
    }
}

fn check_domain(domain: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return Err(format!(
                "its registry {domain:?} opens '[' without closing it"
            ));
        };
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "its registry {domain:?} is not an IPv6 address in brackets"
            ));
        }
        match after {
            "" => (None, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return Err(format!("its registry {domain:?} is not host[:port]")),
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
            return Err(format!("its registry host {host:?} is not a host name"));
        }
    }
    if let Some(port) = port
        && (port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(format!("its registry port {port:?} is not a number"));
    }
    Ok(())
}

fn check_path_component(component: &str) -> Result<(), String> {
    let problem = || {
        Err(format!(
            "its repository path component {component:?} is not valid: components are lower-case \
             letters and digits, separated by '.', '_', '__' or dashes"
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
