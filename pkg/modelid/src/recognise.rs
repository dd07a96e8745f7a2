//! Recognisers for the commands that download a model, and the argv helpers they share.

use std::borrow::Cow;

use crate::argv::{View, basename};
use crate::env::{Env, Val};
use crate::identity::{Identity, Scheme};
use crate::limits::MAX_PATH_BYTES;
use crate::outcome::{Source, Unresolved};
use crate::paths;
use crate::shell::{Command, SVal, Word};
use warmcache_cli::text::shown;

/// A download found in one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub(crate) identity: Identity,
    pub(crate) source: Source,
    /// Destination in the container's own view; `None`: its mount root.
    pub(crate) dest: Option<String>,
}

/// `None`: the rule does not apply; `Some(Err)`: it applies but cannot be decided.
pub(crate) type Found = Option<Result<Finding, Unresolved>>;

/// The field a command's words came from.
pub(crate) fn argv_field(view: &View<'_>) -> String {
    if view.container.args.as_ref().is_some_and(|a| !a.is_empty()) {
        format!("{}.args", view.path)
    } else {
        format!("{}.command", view.path)
    }
}

/// An environment variable as the command's process sees it.
pub(crate) fn cmd_env<'a>(cmd: Option<&'a Command>, env: &'a Env, name: &str) -> Val<'a> {
    if let Some(cmd) = cmd
        && let Some(v) = cmd.overrides.get(name)
    {
        return match v {
            SVal::Known(s) => Val::Known(Cow::Borrowed(s)),
            SVal::Unknown => Val::Unknown {
                field: "the container script".to_owned(),
            },
            SVal::Unset => Val::Absent,
        };
    }
    env.get(name)
}

/// The value of the last `--name value` / `--name=value` among `names`; a flag followed by another
/// option or by nothing has no value and is ignored.
pub(crate) fn flag(words: &[Word], names: &[&str]) -> Option<Word> {
    let mut found = None;
    let mut k = 0;
    while let Some(w) = words.get(k) {
        k += 1;
        if let Some((name, value)) = w.text.split_once('=')
            && names.contains(&name)
        {
            found = Some(Word {
                text: value.to_owned(),
                unknown: w.unknown,
            });
            continue;
        }
        if names.contains(&w.text.as_str())
            && let Some(v) = words.get(k)
            && !v.text.starts_with('-')
        {
            found = Some(v.clone());
            k += 1;
        }
    }
    found
}

/// Whether any of the options `names` appears (with or without a value).
fn has_flag(words: &[Word], names: &[&str]) -> Option<String> {
    words.iter().find_map(|w| {
        let name = w.text.split_once('=').map_or(w.text.as_str(), |(n, _)| n);
        names.contains(&name).then(|| name.to_owned())
    })
}

/// Positional arguments, skipping options; `with_value` options consume the next word.
pub(crate) fn positionals<'w>(words: &'w [Word], with_value: &[&str]) -> Vec<&'w Word> {
    let mut out = Vec::new();
    let mut k = 0;
    while let Some(w) = words.get(k) {
        let t = w.text.as_str();
        if t.starts_with('-') && t.len() > 1 && !w.unknown {
            k += if !t.contains('=') && with_value.contains(&t) {
                2
            } else {
                1
            };
        } else {
            out.push(w);
            k += 1;
        }
    }
    out
}

/// A destination path word: absolute, or relative to a known working directory; at most
/// [`MAX_PATH_BYTES`] long (the kernel refuses longer paths).
pub(crate) fn dest_path(
    w: &Word,
    cwd: Option<&str>,
    field: &str,
    what: &str,
) -> Result<String, Unresolved> {
    if w.unknown {
        return Err(Unresolved::UnknownValue {
            field: field.to_owned(),
            what: format!(
                "{what} {} refers to a value not set literally in the container's env",
                shown(&w.text)
            ),
        });
    }
    let path = if w.text.starts_with('/') {
        paths::clean(&w.text)
    } else {
        match cwd.filter(|c| c.starts_with('/')) {
            Some(c) => paths::join(c, &w.text),
            None => {
                return Err(Unresolved::LandingUnknown {
                    field: field.to_owned(),
                    why: format!(
                        "{what} {} is relative and the working directory is not known",
                        shown(&w.text)
                    ),
                });
            }
        }
    };
    if path.len() > MAX_PATH_BYTES {
        return Err(Unresolved::LandingUnknown {
            field: field.to_owned(),
            why: format!(
                "{what} {} is longer than {MAX_PATH_BYTES} bytes (MAX_PATH_BYTES, Linux PATH_MAX); no container writes there",
                shown(&path)
            ),
        });
    }
    Ok(path)
}

/// The first non-empty of the env variables `names` as a path; `Ok(None)` when none is set.
pub(crate) fn env_path(
    cmd: Option<&Command>,
    view: &View<'_>,
    names: &[&str],
) -> Result<Option<String>, Unresolved> {
    for name in names {
        match cmd_env(cmd, &view.env, name) {
            Val::Known(v) if !v.is_empty() => {
                let cwd = match cmd {
                    Some(c) => c.cwd.as_deref(),
                    None => view.cwd.as_deref(),
                };
                let field = format!("{}.env[{name}]", view.path);
                return dest_path(&Word::known(v.into_owned()), cwd, &field, name).map(Some);
            }
            Val::Unknown { field } => {
                return Err(Unresolved::LandingUnknown {
                    field: if field.starts_with("spec.") {
                        field
                    } else {
                        view.path.to_owned()
                    },
                    why: format!(
                        "{name} decides where the model lands and its value is not known at admission"
                    ),
                });
            }
            _ => {}
        }
    }
    Ok(None)
}

fn unknown(field: &str, what: String) -> Unresolved {
    Unresolved::UnknownValue {
        field: field.to_owned(),
        what,
    }
}

fn identity_or(
    r: Result<Identity, crate::identity::IdentityError>,
    field: &str,
    value: &str,
) -> Result<Identity, Unresolved> {
    r.map_err(|e| Unresolved::InvalidReference {
        field: field.to_owned(),
        value: value.to_owned(),
        why: e.to_string(),
    })
}

/// Classify a model reference given to an engine: a URI of a known scheme, an absolute path, or
/// a Hugging Face repo id (with `revision` from `--revision`).
pub(crate) fn classify_ref(
    value: &Word,
    revision: Option<&Word>,
    field: &str,
    what: &str,
) -> Result<Identity, Unresolved> {
    if value.unknown {
        return Err(unknown(
            field,
            format!(
                "{what} {} refers to a value not set literally in the container's env",
                shown(&value.text)
            ),
        ));
    }
    let text = value.text.trim();
    if let Some((scheme, rest)) = text.split_once("://") {
        let Some(s) = Scheme::from_name(scheme) else {
            return Err(Unresolved::UnsupportedSource {
                field: field.to_owned(),
                value: text.to_owned(),
                why: format!("scheme {} has no shareable identity", shown(scheme)),
            });
        };
        if s == Scheme::Hf && !rest.contains('@') {
            return hf_with_revision(rest, revision, field);
        }
        return identity_or(Identity::parse(text), field, text);
    }
    if text.starts_with('/') {
        return identity_or(Identity::path(text), field, text);
    }
    hf_with_revision(text, revision, field)
}

fn hf_with_revision(
    repo: &str,
    revision: Option<&Word>,
    field: &str,
) -> Result<Identity, Unresolved> {
    let rev = match revision {
        Some(r) if r.unknown => {
            return Err(unknown(
                field,
                format!(
                    "--revision {} refers to a value not set literally in the container's env",
                    shown(&r.text)
                ),
            ));
        }
        Some(r) => Some(r.text.as_str()),
        None => None,
    };
    Identity::hf(repo, rev).map_err(|e| Unresolved::InvalidReference {
        field: field.to_owned(),
        value: repo.to_owned(),
        why: format!("neither a Hugging Face repo id nor an absolute path ({e})"),
    })
}

/// Env variables that point a download of `scheme` at another store than the public one.
fn endpoint_env(scheme: Scheme) -> &'static [&'static str] {
    match scheme {
        Scheme::Hf => &["HF_ENDPOINT"],
        // The AWS CLI and SDKs; s5cmd; KServe's storage-initializer.
        Scheme::S3 => &[
            "AWS_ENDPOINT_URL_S3",
            "AWS_ENDPOINT_URL",
            "S3_ENDPOINT_URL",
            "S3_ENDPOINT",
        ],
        Scheme::Gs => &["CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE"],
        Scheme::Ngc | Scheme::Oci | Scheme::Nim | Scheme::Path => &[],
    }
}

/// The host of `scheme://host[:port][/...]` (or of a bare `host[:port]`), lower-cased.
fn endpoint_host(url: &str) -> String {
    let rest = url.trim().split_once("://").map_or(url.trim(), |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host.split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Whether `url` is the scheme's own public store (so the identity still says where the bytes
/// come from): `huggingface.co` for Hugging Face, an `s3.` host of the AWS commercial partition
/// (`amazonaws.com`, not GovCloud, whose buckets are a separate namespace) for S3.
fn is_public_endpoint(scheme: Scheme, url: &str) -> bool {
    let host = endpoint_host(url);
    match scheme {
        Scheme::Hf => host == "huggingface.co",
        Scheme::S3 => {
            (host.starts_with("s3.") || host.starts_with("s3-"))
                && host.ends_with(".amazonaws.com")
                && !host.contains("us-gov")
        }
        _ => false,
    }
}

/// `Err(CustomEndpoint)` when the download of `scheme` by `cmd` (or by the container, `None`)
/// reads from a custom endpoint: `--endpoint-url` on the command (S3 clients), or an endpoint
/// variable in the command's literal env.
pub(crate) fn custom_endpoint(
    scheme: Scheme,
    cmd: Option<&Command>,
    view: &View<'_>,
) -> Result<(), Unresolved> {
    if scheme == Scheme::S3
        && let Some(c) = cmd
        && has_flag(&c.words, &["--endpoint-url"]).is_some()
    {
        let endpoint = flag(&c.words, &["--endpoint-url"]);
        if endpoint
            .as_ref()
            .is_none_or(|e| e.unknown || !is_public_endpoint(scheme, &e.text))
        {
            return Err(Unresolved::CustomEndpoint {
                field: argv_field(view),
                endpoint: endpoint.filter(|e| !e.unknown).map(|e| e.text),
            });
        }
    }
    for name in endpoint_env(scheme) {
        let from_script = cmd.is_some_and(|c| c.overrides.get(name).is_some());
        match cmd_env(cmd, &view.env, name) {
            Val::Known(v) if !v.trim().is_empty() && !is_public_endpoint(scheme, &v) => {
                return Err(Unresolved::CustomEndpoint {
                    field: if from_script {
                        argv_field(view)
                    } else {
                        format!("{}.env[{name}]", view.path)
                    },
                    endpoint: Some(v.into_owned()),
                });
            }
            Val::Unknown { field } => {
                return Err(Unresolved::CustomEndpoint {
                    field: if field.starts_with("spec.") {
                        field
                    } else {
                        argv_field(view)
                    },
                    endpoint: None,
                });
            }
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Init-container downloaders
// ---------------------------------------------------------------------------------------------

const NGC_VALUE_FLAGS: [&str; 8] = [
    "--dest",
    "--file",
    "--exclude",
    "--org",
    "--team",
    "--ace",
    "--format_type",
    "--format-type",
];

/// `ngc registry model download-version [options] org/[team/]model:version`.
pub(crate) fn ngc_cli(cmd: &Command, view: &View<'_>) -> Found {
    let w = &cmd.words;
    if w.first().map(basename) != Some("ngc") {
        return None;
    }
    let p = w.windows(3).position(|t| {
        t[0].text == "registry" && t[1].text == "model" && t[2].text == "download-version"
    })?;
    let rest = &w[p + 3..];
    let field = argv_field(view);
    if let Some(f) = has_flag(rest, &["--file", "--exclude"]) {
        return Some(Err(Unresolved::PartialDownload {
            field,
            what: format!("ngc download-version {f} selects part of the model version"),
        }));
    }
    let pos = positionals(rest, &NGC_VALUE_FLAGS);
    let Some(artifact) = pos.first() else {
        return Some(Err(Unresolved::InvalidReference {
            field,
            value: String::new(),
            why: "ngc download-version names no org/[team/]model:version".to_owned(),
        }));
    };
    if artifact.unknown {
        return Some(Err(unknown(
            &field,
            format!(
                "the NGC model {} refers to a value not set literally in the container's env",
                shown(&artifact.text)
            ),
        )));
    }
    let identity = match identity_or(Identity::ngc(&artifact.text), &field, &artifact.text) {
        Ok(i) => i,
        Err(e) => return Some(Err(e)),
    };
    let dest = match flag(rest, &["--dest"]) {
        Some(d) => match dest_path(&d, cmd.cwd.as_deref(), &field, "--dest") {
            Ok(d) => Some(d),
            Err(e) => return Some(Err(e)),
        },
        None => match env_path(Some(cmd), view, &["NGC_MODEL_MOUNT"]) {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        },
    };
    Some(Ok(Finding {
        identity,
        source: Source::InitNgcCli,
        dest,
    }))
}

const HF_VALUE_FLAGS: [&str; 10] = [
    "--revision",
    "--local-dir",
    "--cache-dir",
    "--include",
    "--exclude",
    "--token",
    "--repo-type",
    "--local-dir-use-symlinks",
    "--max-workers",
    "--format",
];

/// `hf download` / `huggingface-cli download REPO [options]`.
pub(crate) fn hf_download(cmd: &Command, view: &View<'_>) -> Found {
    let w = &cmd.words;
    let prog = w.first().map(basename)?;
    if !matches!(prog, "hf" | "huggingface-cli")
        || w.get(1).map(|x| x.text.as_str()) != Some("download")
    {
        return None;
    }
    let rest = &w[2..];
    let field = argv_field(view);
    if let Some(f) = has_flag(rest, &["--include", "--exclude"]) {
        return Some(Err(Unresolved::PartialDownload {
            field,
            what: format!("{prog} download {f} selects part of the repository"),
        }));
    }
    if let Some(t) = flag(rest, &["--repo-type"])
        && (t.unknown || t.text != "model")
    {
        return Some(Err(Unresolved::UnsupportedSource {
            field,
            value: t.text,
            why: "only model repositories have an hf:// identity".to_owned(),
        }));
    }
    let pos = positionals(rest, &HF_VALUE_FLAGS);
    let repo = pos.first()?;
    if pos.len() > 1 {
        return Some(Err(Unresolved::PartialDownload {
            field,
            what: format!("{prog} download names files of {}", shown(&repo.text)),
        }));
    }
    let revision = flag(rest, &["--revision"]);
    let identity = match classify_hf(repo, revision.as_ref(), &field) {
        Ok(i) => i,
        Err(e) => return Some(Err(e)),
    };
    if let Err(e) = custom_endpoint(Scheme::Hf, Some(cmd), view) {
        return Some(Err(e));
    }
    let dest_flag = flag(rest, &["--local-dir"])
        .map(|d| (d, "--local-dir"))
        .or_else(|| flag(rest, &["--cache-dir"]).map(|d| (d, "--cache-dir")));
    let dest = match dest_flag {
        Some((d, name)) => match dest_path(&d, cmd.cwd.as_deref(), &field, name) {
            Ok(d) => Some(d),
            Err(e) => return Some(Err(e)),
        },
        None => match env_path(Some(cmd), view, &["HF_HOME", "HF_HUB_CACHE"]) {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        },
    };
    Some(Ok(Finding {
        identity,
        source: Source::InitHfDownload,
        dest,
    }))
}

fn classify_hf(repo: &Word, revision: Option<&Word>, field: &str) -> Result<Identity, Unresolved> {
    if repo.unknown {
        return Err(unknown(
            field,
            format!(
                "the repository {} refers to a value not set literally in the container's env",
                shown(&repo.text)
            ),
        ));
    }
    hf_with_revision(&repo.text, revision, field)
}

const AWS_S3_VALUE_FLAGS: [&str; 30] = [
    "--region",
    "--endpoint-url",
    "--profile",
    "--exclude",
    "--include",
    "--storage-class",
    "--acl",
    "--sse",
    "--sse-c",
    "--sse-c-key",
    "--sse-kms-key-id",
    "--sse-c-copy-source",
    "--sse-c-copy-source-key",
    "--grants",
    "--website-redirect",
    "--content-type",
    "--cache-control",
    "--content-disposition",
    "--content-encoding",
    "--content-language",
    "--expires",
    "--source-region",
    "--metadata",
    "--metadata-directive",
    "--expected-size",
    "--request-payer",
    "--cli-read-timeout",
    "--cli-connect-timeout",
    "--output",
    "--ca-bundle",
];

const S5CMD_GLOBAL_VALUE_FLAGS: [&str; 8] = [
    "--endpoint-url",
    "--numworkers",
    "--retry-count",
    "-r",
    "--log",
    "--credentials-file",
    "--profile",
    "--request-payer",
];

const S5CMD_VALUE_FLAGS: [&str; 21] = [
    "--concurrency",
    "-c",
    "--part-size",
    "-p",
    "--exclude",
    "--include",
    "--storage-class",
    "--content-type",
    "--cache-control",
    "--expires",
    "--metadata",
    "--sse",
    "--sse-kms-key-id",
    "--acl",
    "--content-encoding",
    "--content-disposition",
    "--source-region",
    "--destination-region",
    "--version-id",
    "--raw",
    "--metadata-directive",
];

const GSUTIL_VALUE_FLAGS: [&str; 9] = ["-u", "-o", "-h", "-i", "-L", "-j", "-z", "-a", "-s"];

const GCLOUD_VALUE_FLAGS: [&str; 10] = [
    "--project",
    "--billing-project",
    "--impersonate-service-account",
    "--content-type",
    "--cache-control",
    "--storage-class",
    "--additional-headers",
    "--verbosity",
    "--format",
    "--exclude",
];

/// `aws [global options] s3 sync|cp SRC DST`, `s5cmd [options] cp|sync SRC DST`,
/// `gsutil [-m] cp|rsync [-r] SRC DST`, `gcloud storage cp|rsync SRC DST`.
pub(crate) fn object_copy(cmd: &Command, view: &View<'_>) -> Found {
    let w = &cmd.words;
    let prog = w.first().map(basename)?;
    let field = argv_field(view);
    let (scheme, rest, value_flags, filters, source): (_, &[Word], &[&str], &[&str], _) = match prog
    {
        "aws" => {
            let i = w
                .windows(2)
                .position(|t| t[0].text == "s3" && matches!(t[1].text.as_str(), "sync" | "cp"))?;
            (
                Scheme::S3,
                &w[i + 2..],
                &AWS_S3_VALUE_FLAGS,
                &["--exclude", "--include"],
                Source::InitS3,
            )
        }
        "s5cmd" => {
            let pos = positionals(&w[1..], &S5CMD_GLOBAL_VALUE_FLAGS);
            let sub = pos.first()?;
            if !matches!(sub.text.as_str(), "cp" | "sync") {
                return None;
            }
            let i = w.iter().position(|x| std::ptr::eq(x, *sub))?;
            (
                Scheme::S3,
                &w[i + 1..],
                &S5CMD_VALUE_FLAGS,
                &["--exclude", "--include"],
                Source::InitS3,
            )
        }
        "gsutil" => {
            let pos = positionals(&w[1..], &GSUTIL_VALUE_FLAGS);
            let sub = pos.first()?;
            if !matches!(sub.text.as_str(), "cp" | "rsync") {
                return None;
            }
            let i = w.iter().position(|x| std::ptr::eq(x, *sub))?;
            (
                Scheme::Gs,
                &w[i + 1..],
                &GSUTIL_VALUE_FLAGS,
                &["-x", "-y"],
                Source::InitGs,
            )
        }
        "gcloud" => {
            if w.get(1).map(|x| x.text.as_str()) != Some("storage")
                || !matches!(w.get(2).map(|x| x.text.as_str()), Some("cp" | "rsync"))
            {
                return None;
            }
            (
                Scheme::Gs,
                &w[3..],
                &GCLOUD_VALUE_FLAGS,
                &["--exclude", "-x", "--include"],
                Source::InitGs,
            )
        }
        _ => return None,
    };
    let prefix = match scheme {
        Scheme::Gs => "gs://",
        _ => "s3://",
    };
    let pos = positionals(rest, value_flags);
    let (Some(src), Some(dst)) = (pos.first(), pos.get(1)) else {
        return None;
    };
    if dst.text.starts_with(prefix) || dst.text.contains("://") {
        // An upload or a bucket-to-bucket copy.
        return None;
    }
    if !src.text.starts_with(prefix) {
        if src.unknown {
            return Some(Err(unknown(
                &field,
                format!(
                    "{prog} copies from {}, which is not set literally in the container's env",
                    shown(&src.text)
                ),
            )));
        }
        return None;
    }
    if let Some(f) = has_flag(rest, filters) {
        return Some(Err(Unresolved::PartialDownload {
            field,
            what: format!("{prog} {f} selects part of the prefix"),
        }));
    }
    if pos.len() > 2 {
        return Some(Err(Unresolved::PartialDownload {
            field,
            what: format!("{prog} copies several sources"),
        }));
    }
    if src.unknown {
        return Some(Err(unknown(
            &field,
            format!(
                "the source {} refers to a value not set literally in the container's env",
                shown(&src.text)
            ),
        )));
    }
    let key = src.text[prefix.len()..]
        .trim_end_matches("**")
        .trim_end_matches('*')
        .trim_end_matches('/');
    if key.contains(['*', '?']) {
        return Some(Err(Unresolved::PartialDownload {
            field,
            what: format!(
                "the wildcard in {} selects part of the prefix",
                shown(&src.text)
            ),
        }));
    }
    let identity = match identity_or(Identity::new(scheme, key, None, None), &field, &src.text) {
        Ok(i) => i,
        Err(e) => return Some(Err(e)),
    };
    if let Err(e) = custom_endpoint(scheme, Some(cmd), view) {
        return Some(Err(e));
    }
    let dest = match dest_path(dst, cmd.cwd.as_deref(), &field, "the destination") {
        Ok(d) => d,
        Err(e) => return Some(Err(e)),
    };
    Some(Ok(Finding {
        identity,
        source,
        dest: Some(dest),
    }))
}

/// A KServe storage URI: `hf://org/repo[:revision]`, `s3://`, `gs://`, `oci://`, `ngc://`.
fn kserve_uri(uri: &str, field: &str) -> Result<Identity, Unresolved> {
    let unsupported = |why: &str| Unresolved::UnsupportedSource {
        field: field.to_owned(),
        value: uri.to_owned(),
        why: why.to_owned(),
    };
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(unsupported("not a storage URI"));
    };
    match Scheme::from_name(scheme) {
        Some(Scheme::Hf) => {
            // KServe writes the revision after ':' (hf://org/repo:hash); accept ours too.
            let (repo, rev) = match rest.rsplit_once('@') {
                Some((r, v)) => (r, Some(v)),
                None => match rest.rsplit_once(':') {
                    Some((r, v)) => (r, Some(v)),
                    None => (rest, None),
                },
            };
            identity_or(Identity::hf(repo, rev), field, uri)
        }
        Some(s @ (Scheme::S3 | Scheme::Gs | Scheme::Oci | Scheme::Ngc)) => {
            identity_or(Identity::new(s, rest, None, None), field, uri)
        }
        _ => Err(unsupported(&format!(
            "scheme {} has no shareable identity",
            shown(scheme)
        ))),
    }
}

/// A KServe storage-initializer: `args: [URI, DEST]` (pairs for several URIs).
pub(crate) fn kserve(view: &View<'_>) -> Vec<Result<Finding, Unresolved>> {
    if !view.image().contains("storage-initializer") || view.args.len() < 2 {
        return Vec::new();
    }
    view.args
        .chunks_exact(2)
        .enumerate()
        .map(|(k, pair)| {
            let field = format!("{}.args[{}]", view.path, 2 * k);
            let (uri, dest) = (&pair[0], &pair[1]);
            if uri.unknown {
                return Err(unknown(
                    &field,
                    format!(
                        "storage URI {} refers to a value not set literally in the container's env",
                        shown(&uri.text)
                    ),
                ));
            }
            if uri.text.starts_with("pvc://") {
                return Err(Unresolved::PvcStorageUri {
                    field,
                    uri: uri.text.clone(),
                });
            }
            let identity = kserve_uri(&uri.text, &field)?;
            custom_endpoint(identity.scheme(), None, view)?;
            let dest_field = format!("{}.args[{}]", view.path, 2 * k + 1);
            let dest = dest_path(dest, view.cwd.as_deref(), &dest_field, "the destination")?;
            Ok(Finding {
                identity,
                source: Source::KServeStorageInitializer,
                dest: Some(dest),
            })
        })
        .collect()
}

/// Every download one init container performs, in rule order: `NGC_MODEL_NAME` in its env, then
/// each command (NGC CLI, hf download, object copies), then a KServe storage-initializer.
pub(crate) fn init_findings(view: &View<'_>) -> Vec<Result<Finding, Unresolved>> {
    let mut out = Vec::new();
    let mut from_commands = Vec::new();
    for cmd in &view.commands {
        if let Some(f) = ngc_cli(cmd, view)
            .or_else(|| hf_download(cmd, view))
            .or_else(|| object_copy(cmd, view))
        {
            from_commands.push(f);
        }
    }
    match view.env.get("NGC_MODEL_NAME") {
        Val::Known(name) if !name.is_empty() => {
            let field = format!("{}.env[NGC_MODEL_NAME]", view.path);
            let found = identity_or(Identity::ngc(&name), &field, &name).and_then(|identity| {
                let dest = match env_path(None, view, &["NGC_MODEL_MOUNT"])? {
                    Some(d) => Some(d),
                    None => {
                        let ngc_dest = view.commands.iter().find_map(|cmd| {
                            let _is_ngc = ngc_cli(cmd, view)?;
                            let w = &cmd.words;
                            flag(w, &["--dest"]).map(|d| (d, cmd.cwd.clone()))
                        });
                        match ngc_dest {
                            Some((d, cwd)) => {
                                Some(dest_path(&d, cwd.as_deref(), &argv_field(view), "--dest")?)
                            }
                            None => None,
                        }
                    }
                };
                Ok(Finding {
                    identity,
                    source: Source::InitNgcEnv,
                    dest,
                })
            });
            out.push(found);
        }
        Val::Unknown { field } => out.push(Err(unknown(
            &field,
            "NGC_MODEL_NAME names the model this init container downloads and is not set literally"
                .to_owned(),
        ))),
        _ => {}
    }
    out.extend(from_commands);
    out.extend(kserve(view));
    out
}
