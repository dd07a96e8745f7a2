//! The `catalog-configmap` artifact: the ConfigMap manifest that holds the shipped storage
//! capability catalog, exactly as `warmcache_catalog::render_config_map(BUILTIN_CATALOG)` renders
//! it (`pkg/catalog/tests/shipped.rs` checks the `config/` copy against that same function).
//!
//! Two byte-identical copies: `config/catalog/` (applied with `kubectl -n`, see docs/catalog.md)
//! and `charts/warmcache/files/`. The chart copy lives in `files/`, not `templates/` or `crds/`:
//! Helm renders everything under `templates/` as a Go template and installs it, which would both
//! parse the catalog text as template syntax and make every release own (and overwrite on
//! upgrade) the ConfigMap operators edit; `crds/` is for CRDs only. A file under `files/` is
//! packaged but inert until a template reads it with
//! `.Files.Get "files/nvcf-storage-capabilities.configmap.yaml"`.

use anyhow::Result;
use warmcache_catalog::{BUILTIN_CATALOG, BUILTIN_CATALOG_PATH, render_config_map};

use super::GeneratedFile;

/// File name of the manifest in each output directory (the last component of
/// `warmcache_catalog::CONFIG_MAP_MANIFEST_PATH`; a test keeps the two equal).
pub const FILE_NAME: &str = "nvcf-storage-capabilities.configmap.yaml";

/// What the manifest is generated from, as named in `--check` hints.
pub const SOURCE: &str = BUILTIN_CATALOG_PATH;

/// The artifact's source-of-truth function.
pub fn render_all() -> Result<Vec<GeneratedFile>> {
    Ok(vec![GeneratedFile {
        name: FILE_NAME.to_owned(),
        content: render_config_map(BUILTIN_CATALOG),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_exactly_what_the_catalog_crate_renders() {
        let files = render_all().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].content, render_config_map(BUILTIN_CATALOG));
        assert_eq!(
            format!("config/catalog/{}", files[0].name),
            warmcache_catalog::CONFIG_MAP_MANIFEST_PATH
        );
    }
}
