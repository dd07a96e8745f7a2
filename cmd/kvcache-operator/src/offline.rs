//! The offline commands: `validate` and `render`.

use std::io::Write;
use std::path::Path;

use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::{
    DecodeFailure, FieldError, RenderContext, StoredObjectError, ValidationContext, parse_backend,
    parse_document, render as render_backend, validate as validate_backend, validate_values,
};

use crate::{ImageSetting, Outcome, RenderArgs, RunError, ValidateArgs};

fn read(path: &Path) -> Result<String, RunError> {
    Ok(warmcache_cli::input::read(path)?)
}

/// How `path` is named in messages (escaped: a path is user input).
fn shown(path: &Path) -> String {
    warmcache_cli::input::Source::of(path).name()
}

/// A backend read from `path`: `Ok(Ok(backend))`, `Ok(Err(shape problems))`, or an error for
/// input that is no backend at all.
fn load(path: &Path) -> Result<Result<KVCacheBackend, Vec<FieldError>>, RunError> {
    let text = read(path)?;
    match parse_backend(&text) {
        Ok(backend) => Ok(Ok(backend)),
        Err(DecodeFailure::Shape(errors)) => Ok(Err(errors)),
        Err(DecodeFailure::NotABackend(source)) => Err(RunError::NotABackend {
            path: shown(path),
            source,
        }),
    }
}

fn validation_context(image: &ImageSetting) -> ValidationContext {
    ValidationContext {
        default_image: image.default_image.clone(),
    }
}

fn print_refusals(out: &mut dyn Write, errors: &[FieldError]) -> Result<(), RunError> {
    for error in errors {
        writeln!(out, "{error}")?;
    }
    Ok(())
}

/// The document in `path`, checked to be a `KVCacheBackend` but not decoded.
fn load_document(path: &Path) -> Result<serde_json::Value, RunError> {
    let text = read(path)?;
    parse_document(&text).map_err(|source| RunError::NotABackend {
        path: shown(path),
        source,
    })
}

/// `kvcache-operator validate`: the same decision as the webhook ([`validate_values`]), so an
/// update that leaves `spec` unchanged is admitted even when the stored object no longer decodes.
pub fn validate(args: &ValidateArgs, out: &mut dyn Write) -> Result<Outcome, RunError> {
    warmcache_cli::input::stdin_at_most_once(&[
        ("-f", Some(&args.input.file)),
        ("--old", args.old.as_deref()),
    ])?;
    let old = args.old.as_deref().map(load_document).transpose()?;
    let new = load_document(&args.input.file)?;
    let errors = validate_values(&new, old.as_ref(), &validation_context(&args.image)).map_err(
        |StoredObjectError(errors)| {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            RunError::OldShape {
                path: args.old.as_deref().map_or_else(String::new, shown),
                lines: lines.join("\n"),
            }
        },
    )?;
    if errors.is_empty() {
        writeln!(out, "ok")?;
        Ok(Outcome::Ok)
    } else {
        print_refusals(out, &errors)?;
        Ok(Outcome::Refused)
    }
}

/// `kvcache-operator render`.
pub fn render(
    args: &RenderArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Outcome, RunError> {
    if let Some(problem) = warmcache_kvcache::names::dns1123_label_problem(&args.namespace) {
        return Err(RunError::Namespace {
            namespace: args.namespace.clone(),
            problem,
        });
    }
    let backend = match load(&args.input.file)? {
        Ok(backend) => backend,
        Err(errors) => {
            print_refusals(out, &errors)?;
            return Ok(Outcome::Refused);
        }
    };
    let errors = validate_backend(&backend, None, &validation_context(&args.image));
    if !errors.is_empty() {
        print_refusals(out, &errors)?;
        return Ok(Outcome::Refused);
    }
    if backend.spec.connection.external.is_some() {
        writeln!(
            err,
            "note: {} is an external backend: the operator runs nothing for it, so there is nothing to render",
            shown(&args.input.file)
        )?;
        return Ok(Outcome::Ok);
    }
    if backend.metadata.uid.is_none() {
        writeln!(
            err,
            "note: {} has no metadata.uid, so the rendered objects carry no owner reference; the operator \
             sets one from the stored backend",
            shown(&args.input.file)
        )?;
    }
    let ctx = RenderContext {
        namespace: args.namespace.clone(),
        default_image: args.image.default_image.clone(),
        image_users: args.store_image_user.clone(),
    };
    let rendered = render_backend(&backend, &ctx)?;
    let text = rendered
        .to_yaml_stream()
        .map_err(|e| RunError::Yaml(e.to_string()))?;
    out.write_all(text.as_bytes())?;
    Ok(Outcome::Ok)
}
