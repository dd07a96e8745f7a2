//! Hand-written schema fragments the derive cannot produce on its own.

use schemars::{Schema, SchemaGenerator, json_schema};

/// The pattern Kubernetes tooling attaches to `resource.Quantity` fields (sign, digits with an
/// optional fraction, then a binary-SI, decimal-SI or exponent suffix).
pub(crate) const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Longest quantity string accepted. No sensible quantity comes near it; the bound exists so the
/// API server can bound the cost of the CEL rules that parse quantities with `quantity()`.
/// Without it kube-apiserver 1.36 estimates an int-or-string at the full request size and refuses
/// the CRD (those rules exceed the per-rule cost budget about twofold, once multiplied by the 32
/// member groups).
pub(crate) const QUANTITY_MAX_LENGTH: u32 = 64;

/// Schema of a `Quantity` field: an int-or-string (structural: no `type`, only
/// `x-kubernetes-int-or-string`) whose string form must match [`QUANTITY_PATTERN`].
///
/// k8s-openapi's own schema for `Quantity` carries only `x-kubernetes-int-or-string` plus a long
/// generic description; this one adds the pattern and a length bound and leaves the description
/// to the field's doc comment. No `anyOf: [integer, string]` is emitted: kube's structural
/// rewriter would strip the branch types, and the extension alone is structural.
pub(crate) fn quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "pattern": QUANTITY_PATTERN,
        "maxLength": QUANTITY_MAX_LENGTH,
    })
}

/// Drops the type-level description from an enum's schema.
///
/// kube's `OptionalEnum` rewrite hoists the enum's own schema over an `Option<Enum>` property,
/// description included, which would replace the field's doc comment (what `kubectl explain`
/// prints for the field) with the enum type's. Without a type-level description the field's
/// stays.
pub(crate) fn no_type_description(schema: &mut Schema) {
    schema.remove("description");
}
