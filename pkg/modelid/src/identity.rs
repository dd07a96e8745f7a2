//! The identity of a model artifact: `{scheme, ref, revision, profile}` and its URI form.
//!
//! One URI names one artifact for every chart, version and namespace that downloads it, so it is
//! the cache handle. Rendering is `<scheme>://<ref>[@<revision>][@<profile>]`; which parts a scheme
//! may carry is fixed per scheme so that parsing a rendered URI always gives the identity back.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use warmcache_cli::text::shown;

use crate::paths;

/// Where an artifact comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// A Hugging Face Hub model repository: `hf://org/repo[@revision]`.
    Hf,
    /// An NGC model version: `ngc://org/[team/]model:version`.
    Ngc,
    /// An S3 object or prefix: `s3://bucket/key`.
    S3,
    /// A Google Cloud Storage object or prefix: `gs://bucket/key`.
    Gs,
    /// An OCI artifact: `oci://registry/repository[:tag|@digest]`.
    Oci,
    /// A NIM container image and the model profile it serves: `nim://image[@profile]`.
    Nim,
    /// A path already present in the pod: `path:///abs`. Never downloaded, never shared.
    Path,
}

impl Scheme {
    /// Every scheme, in a fixed order.
    pub const ALL: [Scheme; 7] = [
        Scheme::Hf,
        Scheme::Ngc,
        Scheme::S3,
        Scheme::Gs,
        Scheme::Oci,
        Scheme::Nim,
        Scheme::Path,
    ];

    /// The URI scheme name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scheme::Hf => "hf",
            Scheme::Ngc => "ngc",
            Scheme::S3 => "s3",
            Scheme::Gs => "gs",
            Scheme::Oci => "oci",
            Scheme::Nim => "nim",
            Scheme::Path => "path",
        }
    }

    /// The scheme named `name` (exact, lowercase).
    pub fn from_name(name: &str) -> Option<Scheme> {
        Scheme::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a string or a set of parts is not an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The text has no `<scheme>://`.
    #[error("{} is not a model URI: expected <scheme>://<reference>", shown(.uri))]
    NotAUri {
        /// The text given.
        uri: String,
    },
    /// The scheme is not one of [`Scheme::ALL`].
    #[error("unknown model URI scheme {} (known: hf, ngc, s3, gs, oci, nim, path)", shown(.scheme))]
    UnknownScheme {
        /// The scheme given.
        scheme: String,
    },
    /// A part is malformed for its scheme.
    #[error("invalid {scheme} {part} {}: {why}", shown(.value))]
    Invalid {
        /// The scheme the part belongs to.
        scheme: Scheme,
        /// `reference`, `revision` or `profile`.
        part: &'static str,
        /// The offending value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Longest reference (bytes): a path is at most `PATH_MAX` (4096), an S3 or GCS object name at
/// most 1024 bytes, an image reference well below 4096.
const MAX_REFERENCE_BYTES: usize = 4096;

/// Longest revision or profile (bytes): Hugging Face revisions are branch, tag or commit names;
/// NIM profiles are 64-character ids or short names.
const MAX_TAG_BYTES: usize = 1024;

/// A model identity. Construct with [`Identity::new`] or one of the scheme constructors, or parse a
/// URI; every constructor validates, so `Identity::from_str(&id.to_string()) == Ok(id)` holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    scheme: Scheme,
    reference: String,
    revision: Option<String>,
    profile: Option<String>,
}

impl Identity {
    /// Validate and build an identity from its parts.
    ///
    /// Per scheme: `hf` takes a repo id (`name` or `org/name`) and an optional revision; `nim` takes an
    /// image reference and an optional profile; `path` takes an absolute path, which is cleaned;
    /// `s3` and `gs` take `bucket[/key]` with trailing slashes removed; `ngc` takes
    /// `org/[team/]model:version`; `oci` takes a reference. Other combinations are refused.
    pub fn new(
        scheme: Scheme,
        reference: &str,
        revision: Option<&str>,
        profile: Option<&str>,
    ) -> Result<Self, IdentityError> {
        let invalid = |part: &'static str, value: &str, why: &'static str| IdentityError::Invalid {
            scheme,
            part,
            value: value.to_owned(),
            why,
        };
        for (part, value, max) in [
            ("reference", Some(reference), MAX_REFERENCE_BYTES),
            ("revision", revision, MAX_TAG_BYTES),
            ("profile", profile, MAX_TAG_BYTES),
        ] {
            if let Some(v) = value {
                if v.is_empty() {
                    return Err(invalid(part, v, "must not be empty"));
                }
                if v.len() > max {
                    return Err(invalid(
                        part,
                        v,
                        if max == MAX_REFERENCE_BYTES {
                            "is longer than 4096 bytes (no store names an artifact that long)"
                        } else {
                            "is longer than 1024 bytes"
                        },
                    ));
                }
                if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(invalid(
                        part,
                        v,
                        "must not contain whitespace or control characters",
                    ));
                }
            }
        }
        if revision.is_some() && scheme != Scheme::Hf {
            return Err(invalid(
                "revision",
                revision.unwrap_or_default(),
                "only hf identities carry a revision",
            ));
        }
        if profile.is_some() && scheme != Scheme::Nim {
            return Err(invalid(
                "profile",
                profile.unwrap_or_default(),
                "only nim identities carry a profile",
            ));
        }
        let reference = match scheme {
            Scheme::Hf => {
                if let Err(why) = check_hf_repo_id(reference) {
                    return Err(invalid("reference", reference, why));
                }
                if let Some(rev) = revision
                    && rev.contains('@')
                {
                    return Err(invalid("revision", rev, "must not contain '@'"));
                }
                reference.to_owned()
            }
            Scheme::Ngc => {
                if let Err(why) = check_ngc_artifact(reference) {
                    return Err(invalid("reference", reference, why));
                }
                reference.to_owned()
            }
            Scheme::S3 | Scheme::Gs => {
                let trimmed = reference.trim_end_matches('/');
                if trimmed.is_empty() || trimmed.starts_with('/') {
                    return Err(invalid("reference", reference, "expected bucket[/key]"));
                }
                if trimmed.contains(['*', '?']) {
                    return Err(invalid(
                        "reference",
                        reference,
                        "wildcards select part of a prefix; an identity names the whole prefix",
                    ));
                }
                trimmed.to_owned()
            }
            Scheme::Oci => {
                if reference.starts_with('/') {
                    return Err(invalid(
                        "reference",
                        reference,
                        "expected registry/repository",
                    ));
                }
                reference.to_owned()
            }
            Scheme::Nim => {
                // An '@' in the image must introduce a digest (`@sha256:...`), so that a trailing
                // `@profile` (which never contains ':') is unambiguous.
                if let Some((_, tail)) = reference.rsplit_once('@')
                    && !tail.contains(':')
                {
                    return Err(invalid(
                        "reference",
                        reference,
                        "an '@' in the image must introduce a digest such as @sha256:...",
                    ));
                }
                if reference.ends_with('@') || reference.starts_with('/') {
                    return Err(invalid(
                        "reference",
                        reference,
                        "expected an image reference",
                    ));
                }
                if let Some(p) = profile
                    && p.contains(['@', ':', '/'])
                {
                    return Err(invalid("profile", p, "must not contain '@', ':' or '/'"));
                }
                reference.to_owned()
            }
            Scheme::Path => {
                if !reference.starts_with('/') {
                    return Err(invalid("reference", reference, "must be an absolute path"));
                }
                paths::clean(reference)
            }
        };
        Ok(Identity {
            scheme,
            reference,
            revision: revision.map(str::to_owned),
            profile: profile.map(str::to_owned),
        })
    }

    /// `hf://repo[@revision]`.
    pub fn hf(repo: &str, revision: Option<&str>) -> Result<Self, IdentityError> {
        Identity::new(Scheme::Hf, repo, revision, None)
    }

    /// `ngc://org/[team/]model:version`.
    pub fn ngc(artifact: &str) -> Result<Self, IdentityError> {
        Identity::new(Scheme::Ngc, artifact, None, None)
    }

    /// `nim://image[@profile]`.
    pub fn nim(image: &str, profile: Option<&str>) -> Result<Self, IdentityError> {
        Identity::new(Scheme::Nim, image, None, profile)
    }

    /// `path:///abs` (cleaned).
    pub fn path(abs: &str) -> Result<Self, IdentityError> {
        Identity::new(Scheme::Path, abs, None, None)
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The reference (repo id, artifact, bucket/key, image or path).
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The revision (hf only).
    pub fn revision(&self) -> Option<&str> {
        self.revision.as_deref()
    }

    /// The profile (nim only).
    pub fn profile(&self) -> Option<&str> {
        self.profile.as_deref()
    }

    /// The URI; same as `to_string()`.
    pub fn uri(&self) -> String {
        self.to_string()
    }

    /// Parse a URI of one of the schemes, as rendered by [`Identity::uri`]. `path` URIs are
    /// cleaned, `s3`/`gs` lose trailing slashes; everything else must already be canonical.
    pub fn parse(uri: &str) -> Result<Self, IdentityError> {
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Err(IdentityError::NotAUri {
                uri: uri.to_owned(),
            });
        };
        let Some(scheme) = Scheme::from_name(scheme) else {
            return Err(IdentityError::UnknownScheme {
                scheme: scheme.to_owned(),
            });
        };
        match scheme {
            Scheme::Hf => match rest.rsplit_once('@') {
                Some((repo, rev)) => Identity::new(scheme, repo, Some(rev), None),
                None => Identity::new(scheme, rest, None, None),
            },
            Scheme::Nim => match rest.rsplit_once('@') {
                Some((image, profile)) if !profile.contains(':') && !profile.contains('/') => {
                    Identity::new(scheme, image, None, Some(profile))
                }
                _ => Identity::new(scheme, rest, None, None),
            },
            _ => Identity::new(scheme, rest, None, None),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.reference)?;
        if let Some(rev) = &self.revision {
            write!(f, "@{rev}")?;
        }
        if let Some(profile) = &self.profile {
            write!(f, "@{profile}")?;
        }
        Ok(())
    }
}

impl FromStr for Identity {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Identity::parse(s)
    }
}

impl Serialize for Identity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Identity::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Hugging Face repo id rules: `name` or `namespace/name`; letters, digits, `-`, `_`, `.`; no `--`
/// or `..`; a part neither starts nor ends with `-` or `.`; at most 96 characters per part.
pub(crate) fn check_hf_repo_id(id: &str) -> Result<(), &'static str> {
    let parts: Vec<&str> = id.splitn(3, '/').collect();
    if parts.len() > 2 {
        return Err("a repo id is `name` or `namespace/name`");
    }
    for part in parts {
        if part.is_empty() || part.len() > 96 {
            return Err("each part of a repo id has 1 to 96 characters");
        }
        if !part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err("a repo id uses letters, digits, '-', '_' and '.' only");
        }
        if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
            return Err("a part of a repo id neither starts nor ends with '-' or '.'");
        }
        if part.contains("--") || part.contains("..") {
            return Err("'--' and '..' are not allowed in a repo id");
        }
    }
    Ok(())
}

/// NGC model artifact: `org/[team/]model:version`, each part non-empty, no '@'.
pub(crate) fn check_ngc_artifact(artifact: &str) -> Result<(), &'static str> {
    let Some((path, version)) = artifact.rsplit_once(':') else {
        return Err("expected org/[team/]model:version");
    };
    let parts: Vec<&str> = path.split('/').collect();
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
        return Err("expected org/[team/]model:version");
    }
    if version.is_empty() || artifact.contains('@') || version.contains('/') {
        return Err("expected org/[team/]model:version");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_revision_splits_on_last_at() {
        let id = Identity::parse("hf://Qwen/Qwen3-0.6B@v1").unwrap();
        assert_eq!(id.scheme(), Scheme::Hf);
        assert_eq!(id.reference(), "Qwen/Qwen3-0.6B");
        assert_eq!(id.revision(), Some("v1"));
        assert_eq!(id.uri(), "hf://Qwen/Qwen3-0.6B@v1");
    }

    #[test]
    fn nim_digest_is_part_of_the_image() {
        let id = Identity::parse("nim://nvcr.io/nim/meta/llama@sha256:abcd").unwrap();
        assert_eq!(id.reference(), "nvcr.io/nim/meta/llama@sha256:abcd");
        assert_eq!(id.profile(), None);
        let id =
            Identity::parse("nim://nvcr.io/nim/meta/llama@sha256:abcd@tensorrt_llm-h100").unwrap();
        assert_eq!(id.reference(), "nvcr.io/nim/meta/llama@sha256:abcd");
        assert_eq!(id.profile(), Some("tensorrt_llm-h100"));
        let id = Identity::parse(
            "nim://nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.3@tensorrt_llm-h100-fp8",
        )
        .unwrap();
        assert_eq!(
            id.reference(),
            "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.3"
        );
        assert_eq!(id.profile(), Some("tensorrt_llm-h100-fp8"));
    }

    #[test]
    fn path_is_cleaned_and_rendered_with_three_slashes() {
        let id = Identity::parse("path:///models//llama/./x/..").unwrap();
        assert_eq!(id.reference(), "/models/llama");
        assert_eq!(id.uri(), "path:///models/llama");
        assert!(Identity::parse("path://models").is_err());
    }

    #[test]
    fn s3_trailing_slash_is_trimmed_and_at_is_kept() {
        let id = Identity::parse("s3://my-bucket/models/llama-70b/").unwrap();
        assert_eq!(id.uri(), "s3://my-bucket/models/llama-70b");
        let id = Identity::parse("s3://b/models@v2").unwrap();
        assert_eq!(id.reference(), "b/models@v2");
        assert!(Identity::parse("s3://b/models/*").is_err());
    }

    #[test]
    fn invalid_parts_are_refused() {
        assert!(Identity::parse("hf://a/b/c").is_err());
        assert!(Identity::parse("hf://-a/b").is_err());
        assert!(Identity::parse("hf://a/b@").is_err());
        assert!(Identity::parse("ngc://org/model").is_err());
        assert!(Identity::parse("ftp://x").is_err());
        assert!(Identity::parse("Qwen/Qwen3").is_err());
        assert!(Identity::new(Scheme::S3, "b/k", Some("v1"), None).is_err());
        assert!(Identity::new(Scheme::Nim, "img:1", None, Some("a:b")).is_err());
        assert!(Identity::new(Scheme::Nim, "img@notadigest", None, None).is_err());
        assert!(Identity::parse("ngc://org/team/model:1").is_ok());
    }
}
