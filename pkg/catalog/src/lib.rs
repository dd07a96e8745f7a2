//! Storage capability catalog: strict loader, packaged JSON Schema, flow derivation, digests and
//! the pure storage decision that a ModelCacheBinding freezes.
//!
//! The catalog (`storage.nvcf.nvidia.com/v1alpha1`, `StorageCapabilityCatalog`) lists, per exact
//! CSI provisioner, the access modes a qualification run proved and the mount options reader
//! volumes get. It never declares a flow: [`derive_flow`] derives `rwxReadOnly`, `roxReadOnly`
//! or `disabled` per workflow. [`decide`] turns StorageClass `nvcf-sc`, the provisioner's
//! CSIDriver, the catalog and the feature gates into either the exact `spec.decision` and
//! `spec.storageClass` of a binding or a typed [`NonDurable`] reason.
//!
//! Sources: the ConfigMap [`CONFIG_MAP_NAME`] (key [`CONFIG_MAP_KEY`]) is authoritative; the
//! compiled-in [`BUILTIN_CATALOG`] (the file [`BUILTIN_CATALOG_PATH`]) is used only when that
//! ConfigMap does not exist. [`SCHEMA`] is the packaged JSON Schema (draft 2020-12); it accepts
//! exactly what the loader accepts, except duplicate driver names, which only the loader can
//! refuse.
//!
//! Pure: no Kubernetes client, no I/O, no clock. Logging and counting the built-in fallback is
//! the caller's job: after [`decide`], `if outcome.catalog_builtin() { warn; count }`
//! ([`Outcome::catalog_builtin`]; a caller that loads the catalog itself checks
//! [`CatalogSnapshot::is_builtin`]).

mod decision;
mod digest;
mod error;
mod explain;
mod flow;
mod loader;
mod source;

pub use decision::{
    CatalogInput, Decision, DecisionError, DecisionInputs, Gates, NonDurable, Outcome,
    WriterIdentityChoice, WriterIdentitySource, decide, writer_identity,
};
pub use digest::{
    canonical_profile, canonical_storage_class, catalog_revision, profile_digest,
    storage_class_digest,
};
pub use error::{FieldError, FieldErrors, FieldPath, LoadError, ROOT_PATH, Refusal, YamlError};
pub use explain::{Explanation, explain};
pub use flow::{
    DISABLED, DisabledReason, Flow, NVMESH_PROVIDER, derive_flow, required_access_modes,
    required_mount_options, volume_handle_encodes_namespace,
};
pub use loader::{
    API_VERSION, Catalog, DriverProfile, KIND, MAX_MOUNT_OPTION_LENGTH, MAX_MOUNT_OPTIONS,
    MAX_NAME_LENGTH, NEGATING_MOUNT_OPTIONS, WriterIdentity, is_ecma_whitespace,
    is_line_terminator, negate_each_other, parse_yaml,
};
pub use source::{
    BUILTIN_CATALOG, BUILTIN_CATALOG_PATH, CONFIG_MAP_KEY, CONFIG_MAP_NAME, CatalogFile,
    CatalogSnapshot, FileForm, render_config_map,
};

/// The packaged JSON Schema (draft 2020-12) of the catalog document: the file
/// [`SCHEMA_PATH`].
pub const SCHEMA: &str =
    include_str!("../../../config/catalog/nvcf-storage-capabilities-v1alpha1.schema.json");

/// Path of [`SCHEMA`] relative to the repository root.
pub const SCHEMA_PATH: &str = "config/catalog/nvcf-storage-capabilities-v1alpha1.schema.json";

/// `$id` of [`SCHEMA`].
pub const SCHEMA_ID: &str =
    "https://nvcf.nvidia.com/schemas/storage-capability-catalog-v1alpha1.json";

/// Path of the rendered ConfigMap manifest ([`render_config_map`] of [`BUILTIN_CATALOG`])
/// relative to the repository root.
pub const CONFIG_MAP_MANIFEST_PATH: &str =
    "config/catalog/nvcf-storage-capabilities.configmap.yaml";
