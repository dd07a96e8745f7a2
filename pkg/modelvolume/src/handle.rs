//! The cache handle: what one shared copy holds, as one canonical string. Its digest is the
//! binding's `spec.identity.cacheHandleDigest`, so two pods share a copy exactly when their
//! handles are equal.
//!
//! `<identity URI>?layout=<layout>[&endpoint=<url>]...`
//!
//! - The **identity URI** names the artifact (`warmcache_modelid::Identity`).
//! - The **layout** is how the bytes are arranged at the landing: a reader expecting the Hugging
//!   Face hub layout finds nothing in a flat `--local-dir` copy, so the two are never mixed.
//! - Each **endpoint** a download reads from (a Hugging Face mirror, an S3-compatible store) is
//!   part of the handle: the same name on another store may hold other bytes. Endpoints are
//!   sorted and deduplicated, so the order of the variables that set them does not matter.
//! - A **salt** (`&salt=`, the pod's `nvsnap.io/cache-salt` annotation) folds an operator-chosen
//!   value in, for changes the identity cannot see (a floating tag re-pointed, a wheel installed
//!   at start): another salt is another copy.
//! - A **refresh** (`&refresh=`) separates the copies of a *floating* revision (none, a branch
//!   or a tag: anything but a commit) over time: the administrator's refresh label of the
//!   namespace and the window of the maximum age of floating revisions
//!   ([`crate::Options::floating_revision_max_age_seconds`]). A commit never gets one: its bytes
//!   cannot change.
//!
//! - A **capture** (`&fill=capture`) marks a copy the node agent captures from a pod's own
//!   download after it is Ready (an engine script fetching an artifact no writer Job can
//!   reproduce): it holds what that script left, so it is never the same cache as a Job's copy
//!   of the same artifact, and a capture never fills a Job's cache or the reverse.
//!
//! Without a salt, a refresh or a capture the handle is what it always was, so existing caches
//! keep their names.

use std::fmt;

use warmcache_modelid::Identity;

/// How the downloaded bytes are arranged at the landing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// A Hugging Face home (`HF_HOME`): the hub cache is `<landing>/hub/models--org--name/...`.
    Hub,
    /// A Hugging Face hub cache itself (`HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `--cache-dir`,
    /// vLLM's `--download-dir`): `<landing>/models--org--name/...`.
    HubCache,
    /// The artifact's files at the landing (`hf download --local-dir`, the KServe
    /// storage-initializer, `aws s3 sync`, `gsutil`).
    Flat,
    /// What `ngc registry model download-version` writes (`<landing>/<model>_v<version>/...`).
    Ngc,
    /// A NIM cache (`NIM_CACHE_PATH`), as `download-to-cache` fills it.
    Nim,
}

impl Layout {
    /// The name used in the handle.
    pub const fn as_str(self) -> &'static str {
        match self {
            Layout::Hub => "hub",
            Layout::HubCache => "hubCache",
            Layout::Flat => "flat",
            Layout::Ngc => "ngc",
            Layout::Nim => "nim",
        }
    }

    /// Whether readers find the model through the Hugging Face cache variables.
    pub const fn is_hub(self) -> bool {
        matches!(self, Layout::Hub | Layout::HubCache)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one shared copy holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheHandle {
    identity: Identity,
    layout: Layout,
    endpoints: Vec<String>,
    salt: Option<String>,
    refresh: Option<String>,
    capture: bool,
}

/// The part of the handle that marks a captured copy ([`CacheHandle::with_capture`]).
const CAPTURE_PART: &str = "fill=capture";

/// Whether the rendered handle `handle` is a captured copy's ([`CacheHandle::with_capture`]):
/// one of its `&`-separated parameters is exactly `fill=capture`. Every value in a handle is
/// percent-encoded, so no endpoint, salt or refresh can forge the part.
pub fn is_capture_handle(handle: &str) -> bool {
    handle
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|part| part == CAPTURE_PART))
}

/// Whether `identity` names a floating revision: a Hugging Face repository without a revision,
/// or with a branch or tag name, i.e. anything but a full commit hash (40 lowercase hex). Other
/// schemes carry no revision the Hub could move.
pub fn is_floating(identity: &Identity) -> bool {
    identity.scheme() == warmcache_modelid::Scheme::Hf
        && !identity.revision().is_some_and(is_commit)
}

/// Whether `revision` is a full commit hash (40 lowercase hex digits).
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40
        && revision
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// An endpoint as recorded: surrounding blanks and trailing slashes removed.
pub(crate) fn normalize_endpoint(e: &str) -> String {
    e.trim().trim_end_matches('/').to_owned()
}

/// Percent-encode everything but letters, digits and `-._~:/@`, so an endpoint can never forge
/// another `&key=` part.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'/' | b'@')
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl CacheHandle {
    /// The handle of `identity` in `layout`, downloaded from `endpoints` (any order, duplicates
    /// allowed; empty for the public stores).
    pub fn new(identity: Identity, layout: Layout, endpoints: &[String]) -> CacheHandle {
        let mut endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| normalize_endpoint(e))
            .filter(|e| !e.is_empty())
            .collect();
        endpoints.sort();
        endpoints.dedup();
        CacheHandle {
            identity,
            layout,
            endpoints,
            salt: None,
            refresh: None,
            capture: false,
        }
    }

    /// The handle of a copy captured from a pod's own download after it is Ready.
    pub fn with_capture(mut self) -> CacheHandle {
        self.capture = true;
        self
    }

    /// Whether this is a captured copy's handle.
    pub fn is_capture(&self) -> bool {
        self.capture
    }

    /// The handle with `salt` folded in (an empty salt is none).
    pub fn with_salt(mut self, salt: Option<&str>) -> CacheHandle {
        self.salt = salt.filter(|s| !s.is_empty()).map(str::to_owned);
        self
    }

    /// The handle with the refresh `parts` folded in, only when the identity is floating
    /// (`is_floating`); empty parts are dropped, the rest joined with `.` in the order given.
    pub fn with_refresh(mut self, parts: &[&str]) -> CacheHandle {
        let parts: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
        self.refresh = (is_floating(&self.identity) && !parts.is_empty()).then(|| parts.join("."));
        self
    }

    /// The salt, when one is folded in.
    pub fn salt(&self) -> Option<&str> {
        self.salt.as_deref()
    }

    /// The refresh, when one is folded in.
    pub fn refresh(&self) -> Option<&str> {
        self.refresh.as_deref()
    }

    /// The artifact.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The endpoints, sorted.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
}

impl fmt::Display for CacheHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}?layout={}", self.identity, self.layout)?;
        for e in &self.endpoints {
            write!(f, "&endpoint={}", encode(e))?;
        }
        if let Some(salt) = &self.salt {
            write!(f, "&salt={}", encode(salt))?;
        }
        if let Some(refresh) = &self.refresh {
            write!(f, "&refresh={}", encode(refresh))?;
        }
        if self.capture {
            write!(f, "&{CAPTURE_PART}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf() -> Identity {
        Identity::hf("Qwen/Qwen3-0.6B", Some("v1")).unwrap()
    }

    #[test]
    fn renders_canonically() {
        assert_eq!(
            CacheHandle::new(hf(), Layout::Hub, &[]).to_string(),
            "hf://Qwen/Qwen3-0.6B@v1?layout=hub"
        );
        let h = CacheHandle::new(
            hf(),
            Layout::Flat,
            &[
                "https://b.example/ ".into(),
                "https://a.example".into(),
                "https://b.example".into(),
            ],
        );
        assert_eq!(
            h.to_string(),
            "hf://Qwen/Qwen3-0.6B@v1?layout=flat&endpoint=https://a.example&endpoint=https://b.example"
        );
    }

    #[test]
    fn layouts_and_endpoints_separate_handles() {
        let a = CacheHandle::new(hf(), Layout::Hub, &[]);
        let b = CacheHandle::new(hf(), Layout::Flat, &[]);
        let c = CacheHandle::new(hf(), Layout::Hub, &["https://mirror".into()]);
        assert_ne!(a.to_string(), b.to_string());
        assert_ne!(a.to_string(), c.to_string());
    }

    #[test]
    fn an_endpoint_cannot_forge_another_part() {
        let h = CacheHandle::new(hf(), Layout::Hub, &["http://x&layout=flat".into()]);
        assert_eq!(
            h.to_string(),
            "hf://Qwen/Qwen3-0.6B@v1?layout=hub&endpoint=http://x%26layout%3Dflat"
        );
    }

    #[test]
    fn a_capture_is_another_copy_and_cannot_be_forged() {
        let plain = CacheHandle::new(hf(), Layout::Flat, &[]);
        let captured = plain.clone().with_capture();
        assert_eq!(
            captured.to_string(),
            "hf://Qwen/Qwen3-0.6B@v1?layout=flat&fill=capture"
        );
        assert!(is_capture_handle(&captured.to_string()));
        assert!(!is_capture_handle(&plain.to_string()));
        let salted = plain.with_salt(Some("x&fill=capture"));
        assert!(!is_capture_handle(&salted.to_string()));
        let mirror = CacheHandle::new(hf(), Layout::Flat, &["http://m/&fill=capture".into()]);
        assert!(!is_capture_handle(&mirror.to_string()));
        assert!(!is_capture_handle("fill=capture"));
        assert!(!is_capture_handle("hf://a/b?layout=flat&fill=captured"));
    }

    #[test]
    fn salts_and_refreshes_separate_copies_and_cannot_forge_parts() {
        let plain = CacheHandle::new(hf(), Layout::Hub, &[]);
        let salted = plain.clone().with_salt(Some("wheel-2&layout=flat"));
        assert_eq!(
            salted.to_string(),
            "hf://Qwen/Qwen3-0.6B@v1?layout=hub&salt=wheel-2%26layout%3Dflat"
        );
        assert_eq!(plain.clone().with_salt(Some("")), plain);
        assert_eq!(plain.clone().with_salt(None), plain);
        // A tag is floating: the refresh parts separate its copies.
        let refreshed = plain.clone().with_refresh(&["ops-7", "", "w20"]);
        assert_eq!(
            refreshed.to_string(),
            "hf://Qwen/Qwen3-0.6B@v1?layout=hub&refresh=ops-7.w20"
        );
        assert_eq!(plain.clone().with_refresh(&["", ""]), plain);
        // A commit never moves: no refresh.
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let commit = CacheHandle::new(
            Identity::hf("Qwen/Qwen3-0.6B", Some(sha)).unwrap(),
            Layout::Hub,
            &[],
        );
        assert_eq!(commit.clone().with_refresh(&["ops-7"]), commit);
        // No revision is floating (main).
        let none = CacheHandle::new(
            Identity::hf("Qwen/Qwen3-0.6B", None).unwrap(),
            Layout::Hub,
            &[],
        );
        assert_eq!(none.with_refresh(&["w1"]).refresh(), Some("w1"));
        assert!(is_commit(sha));
        assert!(!is_commit(&sha.to_uppercase()));
        assert!(!is_commit("main"));
    }
}
