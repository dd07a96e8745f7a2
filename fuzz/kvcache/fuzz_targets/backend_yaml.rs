//! Fuzz target: any bytes as a KVCacheBackend YAML document (optionally a stored object after a
//! line `---old`), through parsing, validation (create and update) and rendering.
//!
//! Findings are panics anywhere, and an admitted backend that fails to render or renders
//! differently twice.

#![no_main]

use libfuzzer_sys::fuzz_target;
use warmcache_kvcache::{RenderContext, ValidationContext, parse_backend, render, validate};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (new_text, old_text) = match text.split_once("\n---old\n") {
        Some((new, old)) => (new, Some(old)),
        None => (text, None),
    };
    let Ok(new) = parse_backend(new_text) else {
        return;
    };
    let old = old_text.and_then(|t| parse_backend(t).ok());
    for default_image in [None, Some("docker.io/kvcacheai/mooncake:0.3.13".to_owned())] {
        let ctx = ValidationContext {
            default_image: default_image.clone(),
        };
        let errors = validate(&new, old.as_ref(), &ctx);
        assert_eq!(
            errors,
            validate(&new, old.as_ref(), &ctx),
            "validation is deterministic"
        );
        assert!(
            validate(&new, Some(&new), &ctx).is_empty(),
            "an unchanged spec is admitted"
        );
        if old.is_none() && errors.is_empty() && new.spec.connection.managed.is_some() {
            let rctx = RenderContext {
                default_image,
                ..RenderContext::default()
            };
            let first = render(&new, &rctx).expect("an admitted backend renders");
            let second = render(&new, &rctx).expect("an admitted backend renders");
            assert_eq!(first, second, "rendering is deterministic");
            let _ = first.to_yaml_stream();
        }
    }
});
