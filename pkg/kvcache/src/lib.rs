//! KVCacheBackend apply-time validation and workload rendering (pure: no client, no tokio).
//!
//! This crate owns the decisions the `kvcache-operator` makes about a `KVCacheBackend` without
//! talking to the cluster:
//!
//! - [`validate()`]: every refusal of reference section 3, on create (`old` is `None`) and on
//!   update, with its field path and a reason; the CRD's schema and CEL rules are repeated, so the
//!   list is the whole verdict. Ratchets keep objects admitted under older rules updatable, and an
//!   update that leaves `spec` unchanged (the operator's finalizer removal) is never refused.
//!   [`validate_values`] is the same verdict on the raw JSON objects of an admission request; the
//!   webhook and the offline `validate` command both call it, so an update whose `spec` is
//!   unchanged is admitted before either object is decoded.
//! - [`advice::warnings`]: admission warnings (never refusals) for configurations measured not
//!   to work on the real store: a tier too small for one bucket under its marks, `keyLimit`
//!   with eviction enabled, a tier without `capacity`.
//! - [`render()`]: the leader Deployment and Service and one member DaemonSet per group, per
//!   reference section 4, plus, with an active `highAvailability`, the ServiceAccounts, Roles
//!   and RoleBindings the Lease election needs; everything `validate` admits renders,
//!   deterministically.
//! - [`parse_backend`]: a YAML or JSON document read into a backend, with the path of every shape
//!   problem (what the API server's schema would refuse).
//! - [`survey::tier_was_empty`]: the write-once `TierWasEmpty` verdict from the members'
//!   `local-disk-survey` readings (reference section 5.1).
//! - [`status::backend_status`]: phase, conditions, endpoints, capacity and members from the
//!   leader's admin endpoints ([`store`] parses them as the real store serves them) and the
//!   member Pods (reference sections 2 and 5).
//! - [`rollout::restart_plan`]: which stale member Pod to restart now (one per group, only
//!   while every scheduled member is present and the current ones are ready), and
//!   [`rollout::is_ready`].
//! - [`teardown::teardown_step`] and [`teardown::cleanup_pass`]: the ordered teardown and the
//!   per-node emptying of the tier on deletion (reference section 6).
//!
//! ```
//! use warmcache_kvcache::{RenderContext, ValidationContext, parse_backend, render, validate};
//!
//! let backend = parse_backend(
//!     r#"
//! apiVersion: worker.gpustack.ai/v1alpha1
//! kind: KVCacheBackend
//! metadata: {name: kvc}
//! spec:
//!   image: docker.io/kvcacheai/mooncake:0.3.13
//!   connection:
//!     managed:
//!       leader: {}
//!       members:
//!       - nodeSelector: {kvcache: "true"}
//!         medium: DRAM
//!         capacityPerMember: 4Gi
//! "#,
//! )?;
//! assert!(validate(&backend, None, &ValidationContext::default()).is_empty());
//! let objects = render(&backend, &RenderContext::default())?;
//! assert_eq!(objects.members.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod advice;
pub mod condition;
pub mod error;
pub mod image;
pub mod memory;
pub mod names;
pub mod parse;
pub mod quantity;
pub mod render;
pub mod rollout;
pub mod security;
pub mod status;
pub mod store;
pub mod survey;
pub mod teardown;
pub mod validate;
#[cfg(feature = "vectors")]
pub mod vectors;

pub use error::{FieldError, FieldErrorKind, ParseError, RenderError, StoredObjectError};
pub use parse::{DecodeFailure, from_value, parse_backend, parse_document, stored_from_value};
pub use render::{RenderContext, Rendered, render};
pub use validate::{ValidationContext, check_default_image, validate, validate_values};
