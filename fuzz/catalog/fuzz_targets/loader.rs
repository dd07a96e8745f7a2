//! Fuzzes the catalog loader: any bytes, as a catalog document and as a catalog file (bare or
//! ConfigMap manifest), must give a verdict without panicking; an accepted catalog must explain
//! every one of its drivers, and every refusal must render as one line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warmcache_api_modelcache::v2beta1::Workflow;
use warmcache_catalog::{Catalog, CatalogFile, LoadError, explain};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(LoadError::Invalid(errors)) = Catalog::from_yaml(text) {
        assert!(!errors.0.is_empty());
        for error in &errors {
            assert!(!error.to_string().contains('\n'));
        }
    }
    if let Ok(file) = CatalogFile::parse(text) {
        for driver in file.snapshot.catalog().drivers() {
            for workflow in [Workflow::RegularModelCache, Workflow::HelmModelCache] {
                let _ = explain(&file.snapshot, &driver.name, workflow);
            }
        }
    }
});
