//! Apply-time validation of a `KVCacheBackend`, on create and on update.
//!
//! [`validate`] returns every refusal at once, each with its field path. It repeats the rules the
//! CRD schema and its CEL rules already enforce, so that the offline `validate` command gives the
//! whole verdict; the validating webhook returns the same list.
//!
//! # Ratchets
//!
//! An object admitted under older rules must stay updatable, and the operator's own updates
//! (adding or removing its finalizer) must never be refused. So:
//!
//! - an update whose `spec` is unchanged (metadata only: finalizers, labels, annotations) is
//!   admitted without looking any further;
//! - the following rules fire only when the update moves the value they guard (on create they
//!   always fire): the bucket floors (`capacityPerMember` of a tier group, tier `capacity` and
//!   `keyLimit`, compared as quantities), the `extraArgs`/`extraEnv` rules of the leader (also
//!   re-run when highAvailability appears, disappears or changes its snapshot) and of each
//!   group, the image fallback (`spec.image` absent or blank), the snapshot refusal (when
//!   `snapshot` or `replicas` moves), the multi-tenancy refusal, the object-name rule (only
//!   names of groups the old object did not have), the tier path rules (P1-P6, length included:
//!   skipped for a tier whose path equals the old tier's at the same position, since the path is
//!   frozen there and the data already lives at it), and the hostPaths-overlap-with-tier rule
//!   (skipped for a mount path the old group already had, while its tier path is unchanged).
//!
//! Member groups are compared by position: the group at index `i` of the new list with the
//! group at index `i` of the old one.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use warmcache_api_kvcache::v1alpha1::rules::{MAX_MEMBER_GROUPS, messages};
use warmcache_api_kvcache::v1alpha1::{
    EndpointName, EnvEntry, External, HostPathMount, KVCacheBackend, Leader, LocalDisk, Managed,
    Medium, MemberGroup,
};
use warmcache_api_kvcache::{BUCKET_KEYS_FLOOR, BUCKET_SIZE_FLOOR_BYTES, IMAGE_SETTING_NAME};

use crate::error::{FieldError, FieldErrorKind, StoredObjectError};
use crate::parse::{from_value, stored_from_value};
use crate::quantity::{self, Amount};
use crate::{image, names};
use warmcache_cli::text::{self, shown};

/// Inputs of validation that are not in the object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidationContext {
    /// The store image used when a backend names none: the cluster setting
    /// `kv-cache-backend-image`, which the operator takes from its `--default-image` flag.
    /// `None` (or blank) when the setting carries no image.
    pub default_image: Option<String>,
}

impl ValidationContext {
    /// The default image, when the setting carries a non-blank one.
    pub fn default_image(&self) -> Option<&str> {
        self.default_image
            .as_deref()
            .map(str::trim)
            .filter(|image| !image.is_empty())
    }
}

/// Path of the managed branch.
pub const MANAGED_PATH: &str = "spec.connection.managed";
/// Path of the leader.
pub const LEADER_PATH: &str = "spec.connection.managed.leader";
/// Path of the member list.
pub const MEMBERS_PATH: &str = "spec.connection.managed.members";

/// Path of the member group at `index`.
pub fn member_path(index: usize) -> String {
    format!("{MEMBERS_PATH}[{index}]")
}

/// Most leader replicas.
pub const MAX_LEADER_REPLICAS: i32 = 5;
/// Longest `scaleIn.gracePeriodSeconds` the member's unmount endpoint accepts.
pub const MAX_GRACE_PERIOD_SECONDS: i32 = 3600;
/// Where a host fabric's device plugin injects device nodes into the member container.
pub const INFINIBAND_DIR: &str = "/dev/infiniband";

/// Keys the operator derives for the leader from the spec; refused in `leader.extraArgs`.
pub const LEADER_DERIVED_KEYS: [&str; 20] = [
    "allocation_strategy",
    "cluster_id",
    "enable_ha",
    "ha_backend_connstring",
    "ha_backend_type",
    "rpc_address",
    "rpc_interface",
    "enable_offload",
    "offload_on_evict",
    "enable_snapshot",
    "enable_snapshot_restore",
    "snapshot_interval_seconds",
    "snapshot_object_store_type",
    "snapshot_retention_count",
    "enable_multi_tenants",
    "metrics_port",
    "pod_name",
    "pod_namespace",
    "rpc_port",
    "tenant_quota_connector_uri",
];

/// Keys refused in `leader.extraArgs` because the leader misbehaves with them, each with why.
pub const LEADER_FORBIDDEN_KEYS: [(&str, &str); 16] = [
    (
        "enable_oplog",
        "the leader refuses to start with it: the operation log needs the etcd election backend, and this operator elects leaders through a Kubernetes Lease",
    ),
    (
        "config_path",
        "a configuration file makes the leader ignore the rest of its command line, including every flag this operator renders",
    ),
    (
        "tenant_quota_connector_type",
        "with multiTenancy the operator renders the file connector's policy (its URI and the volume it lives on), and the leader workload provides no other kind of source",
    ),
    (
        "enable_cxl",
        "CXL replaces the allocation strategy and advertises capacity that no member contributes",
    ),
    (
        "cxl_path",
        "it configures CXL, which replaces the allocation strategy and advertises capacity that no member contributes",
    ),
    (
        "cxl_size",
        "it configures CXL, which replaces the allocation strategy and advertises capacity that no member contributes",
    ),
    (
        "port",
        "it is an old alias of rpc_port, which the operator renders: two names for one port leave the result to flag order",
    ),
    (
        "etcd_endpoints",
        "this operator runs no etcd: leaders are elected through a Kubernetes Lease",
    ),
    (
        "memory_allocator",
        "switching the allocator silently turns off snapshots and changes how segments are carved, with nothing reporting it",
    ),
    (
        "snapshot_backup_dir",
        "snapshots are not supported: a leader restoring one can answer a key with another key's bytes",
    ),
    (
        "snapshot_payload_store_type",
        "snapshots are not supported: a leader restoring one can answer a key with another key's bytes",
    ),
    (
        "snapshot_payload_backend_type",
        "snapshots are not supported: a leader restoring one can answer a key with another key's bytes",
    ),
    (
        "snapshot_catalog_store_type",
        "snapshots are not supported: a leader restoring one can answer a key with another key's bytes",
    ),
    (
        "snapshot_catalog_backend_type",
        "snapshots are not supported: a leader restoring one can answer a key with another key's bytes",
    ),
    (
        "snapshot_catalog_store_connstring",
        "snapshots are not supported: a leader restoring one can answer a key with another key's bytes",
    ),
    (
        "snapshot_catalog_backend_connstring",
        "snapshots are not supported: a leader restoring one can answer a key with another key's bytes",
    ),
];

/// Environment variables the operator renders for the leader; refused in `leader.extraEnv`.
pub const LEADER_DERIVED_ENVS: [&str; 4] = [
    "KUBERNETES_POD_IP",
    "KUBERNETES_POD_NAME",
    "KUBERNETES_POD_NAMESPACE",
    "MOONCAKE_SNAPSHOT_LOCAL_PATH",
];

/// Member configuration keys the operator derives from the spec; refused in
/// `members[].extraArgs` (`device_name` is deliberately allowed).
pub const MEMBER_DERIVED_KEYS: [&str; 8] = [
    "enable_ssd_offload",
    "global_segment_size",
    "local_buffer_size",
    "local_hostname",
    "master_server_address",
    "metadata_server",
    "protocol",
    "ssd_offload_path",
];

/// The bucket pair the operator fixes for every tier.
pub const BUCKET_ENVS: [&str; 2] = [
    "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
    "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
];

/// Environment variables the operator renders for members (whether or not a given group gets
/// them); refused in `members[].extraEnv`.
pub const MEMBER_DERIVED_ENVS: [&str; 23] = [
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_MASTER",
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
    "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
    "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
    "MOONCAKE_OFFLOAD_ENABLED",
    "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY",
    "MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
    "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION",
    "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
    "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
    "MOONCAKE_PROTOCOL",
    "MC_TE_METRIC",
    "AMD_VISIBLE_DEVICES",
    "CAMBRICON_VISIBLE_DEVICES",
    "IX_VISIBLE_DEVICES",
    "MTHREADS_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
];

/// Longest image reference (`spec.image`, `members[].image`).
const MAX_IMAGE_LENGTH: usize = 512;
/// Most entries of `imagePullSecrets` and of `hostPaths`.
const MAX_LIST_ITEMS: usize = 32;
/// Longest tier path.
const MAX_TIER_PATH_LENGTH: usize = 4096;
/// Longest host path or mount path.
const MAX_HOST_PATH_LENGTH: usize = 1024;
/// Longest external endpoint address.
const MAX_ADDRESS_LENGTH: usize = 259;
/// Consumers named in a refusal before "and N more".
const MAX_NAMED_CONSUMERS: usize = 20;

/// Validates an admission request's objects as the API server sends them: `new`, created (`old`
/// is `None`) or updated from `old`. This is the one entry point of the webhook and of the
/// offline `validate` command, so both decide every update the same way:
///
/// 1. an update whose `spec` is unchanged as JSON (metadata only: the operator's finalizer
///    removal, labels, annotations) is admitted at once, even when the stored object no longer
///    decodes or breaks today's rules: the operator must always be able to release its objects;
/// 2. otherwise `new` is decoded (its shape problems are the refusals), then `old` (fields the
///    API does not have are ignored there), and [`validate`] decides.
///
/// `Ok` carries the refusals (empty admits); `Err` means the update changes the spec of a stored
/// object that does not fit the API, which no verdict can be given for.
pub fn validate_values(
    new: &Value,
    old: Option<&Value>,
    ctx: &ValidationContext,
) -> Result<Vec<FieldError>, StoredObjectError> {
    if let Some(old) = old
        && old.get("spec") == new.get("spec")
    {
        return Ok(Vec::new());
    }
    let new = match from_value(new.clone()) {
        Ok(backend) => backend,
        Err(errors) => return Ok(errors),
    };
    let old = old
        .map(stored_from_value)
        .transpose()
        .map_err(StoredObjectError)?;
    Ok(validate(&new, old.as_ref(), ctx))
}

/// Validates `new`, created (`old` is `None`) or updated from `old`. An empty list admits it.
/// An update with an unchanged `spec` is admitted at once, as in [`validate_values`].
pub fn validate(
    new: &KVCacheBackend,
    old: Option<&KVCacheBackend>,
    ctx: &ValidationContext,
) -> Vec<FieldError> {
    if let Some(old) = old
        && old.spec == new.spec
    {
        // Metadata-only updates (the operator's finalizer removal among them) are never refused.
        return Vec::new();
    }
    let mut v = Validator {
        errors: Vec::new(),
        ctx,
    };
    v.object(new, old);
    v.errors
}

struct Validator<'a> {
    errors: Vec<FieldError>,
    ctx: &'a ValidationContext,
}

impl Validator<'_> {
    fn push(&mut self, path: impl Into<String>, kind: FieldErrorKind, reason: impl Into<String>) {
        self.errors.push(FieldError::new(path, kind, reason));
    }

    fn invalid(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.push(path, FieldErrorKind::Invalid, reason);
    }

    fn forbidden(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.push(path, FieldErrorKind::Forbidden, reason);
    }

    fn required(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.push(path, FieldErrorKind::Required, reason);
    }

    fn object(&mut self, new: &KVCacheBackend, old: Option<&KVCacheBackend>) {
        let spec = &new.spec;
        let old_spec = old.map(|o| &o.spec);

        // O8: the store type.
        if let Some(old_spec) = old_spec
            && old_spec.type_ != spec.type_
        {
            self.invalid("spec.type", messages::TYPE_IMMUTABLE);
        }

        // O6 / O9: exactly one branch, and the branch is frozen.
        let connection = &spec.connection;
        match (&connection.managed, &connection.external) {
            (None, None) => self.required("spec.connection", messages::CONNECTION_NEITHER),
            (Some(_), Some(_)) => self.forbidden("spec.connection", messages::CONNECTION_BOTH),
            _ => {}
        }
        if let Some(old_spec) = old_spec {
            let old_connection = &old_spec.connection;
            if old_connection.managed.is_some() != connection.managed.is_some()
                || old_connection.external.is_some() != connection.external.is_some()
            {
                self.invalid("spec.connection", messages::CONNECTION_BRANCH_IMMUTABLE);
            }
        }

        self.images(new, old);

        if let Some(secrets) = &spec.image_pull_secrets {
            if secrets.len() > MAX_LIST_ITEMS {
                self.push(
                    "spec.imagePullSecrets",
                    FieldErrorKind::TooMany,
                    too_many(secrets.len(), MAX_LIST_ITEMS),
                );
            }
            let within = if secrets.len() > MAX_LIST_ITEMS {
                &[][..]
            } else {
                secrets.as_slice()
            };
            for (i, secret) in within.iter().enumerate() {
                if let Some(problem) = names::dns1123_subdomain_problem(&secret.name) {
                    let kind = if secret.name.is_empty() {
                        FieldErrorKind::Required
                    } else {
                        FieldErrorKind::Invalid
                    };
                    self.push(
                        format!("spec.imagePullSecrets[{i}].name"),
                        kind,
                        format!(
                            "the name of a Secret in the workload namespace is required here ({problem}): an entry \
                             without one fails only when a node pulls the image"
                        ),
                    );
                }
            }
        }

        if let Some(external) = &connection.external {
            self.external(external);
        }
        if let Some(managed) = &connection.managed {
            let old_managed = old_spec.and_then(|s| s.connection.managed.as_ref());
            self.names(new, old_managed);
            self.leader(&managed.leader, old_managed.map(|m| &m.leader), old);
            self.members(managed, old_managed);
        }
    }

    /// O2, O3, O4 and the length bound of every image field. Only a managed backend is asked:
    /// an external one runs no image of this operator's. An empty string is an unset field (as
    /// upstream reads it); `spec.image` is trimmed before it is parsed (and rendered trimmed).
    fn images(&mut self, new: &KVCacheBackend, old: Option<&KVCacheBackend>) {
        let Some(managed) = &new.spec.connection.managed else {
            return;
        };
        let image = unset_if_empty(new.spec.image.as_deref());
        let old_image = old.map(|o| unset_if_empty(o.spec.image.as_deref()));
        let moved = old_image != Some(image);
        match image {
            Some(text) if text.len() > MAX_IMAGE_LENGTH => {
                self.push(
                    "spec.image",
                    FieldErrorKind::TooMany,
                    too_long(MAX_IMAGE_LENGTH),
                );
            }
            Some(text) if text.trim().is_empty() => {
                if moved {
                    self.required(
                        "spec.image",
                        format!(
                            "must not be blank: name an image here, or leave the field out so that the \
                             {IMAGE_SETTING_NAME:?} setting decides"
                        ),
                    );
                }
            }
            Some(text) => self.image_reference("spec.image", text.trim()),
            None => {
                if moved && self.ctx.default_image().is_none() {
                    self.required(
                        "spec.image",
                        format!(
                            "an image is required: neither this field nor the {IMAGE_SETTING_NAME:?} setting \
                             (the operator's --default-image) names one, so nothing decides what the leader \
                             and the members run"
                        ),
                    );
                }
            }
        }
        if over_member_limit(managed) {
            return;
        }
        for (i, group) in managed.members.iter().enumerate() {
            let path = format!("{}.image", member_path(i));
            match unset_if_empty(group.image.as_deref()) {
                Some(text) if text.len() > MAX_IMAGE_LENGTH => {
                    self.push(path, FieldErrorKind::TooMany, too_long(MAX_IMAGE_LENGTH));
                }
                Some(text) if text.trim().is_empty() => self.required(
                    path,
                    "must not be blank: name an image here, or leave the field out so that the backend's \
                     image applies to this group",
                ),
                Some(text) => self.image_reference(&path, text),
                None => {}
            }
        }
    }

    fn image_reference(&mut self, path: &str, text: &str) {
        if let Err(problem) = image::parse(text) {
            self.invalid(
                path,
                format!(
                    "is not a container image reference ({problem}): every Pod using it would fail to \
                     start with InvalidImageName"
                ),
            );
        }
    }

    /// O7.
    fn external(&mut self, external: &External) {
        let path = "spec.connection.external.endpoints";
        if external.endpoints.is_empty() {
            self.required(path, "at least one endpoint is required");
        }
        let mut seen = BTreeSet::new();
        for (i, endpoint) in external.endpoints.iter().enumerate() {
            let name = match endpoint.name {
                EndpointName::Client => "Client",
                EndpointName::Admin => "Admin",
            };
            if !seen.insert(name) {
                self.push(
                    format!("{path}[{i}].name"),
                    FieldErrorKind::Duplicate,
                    format!("{name:?} is listed twice: each role has exactly one address"),
                );
            }
            let address_path = format!("{path}[{i}].address");
            if endpoint.address.len() > MAX_ADDRESS_LENGTH {
                self.push(
                    address_path,
                    FieldErrorKind::TooMany,
                    too_long(MAX_ADDRESS_LENGTH),
                );
            } else if let Err(problem) = host_port_problem(&endpoint.address) {
                self.invalid(
                    address_path,
                    format!(
                        "must be host:port, and the operator dials it exactly as written: {problem}"
                    ),
                );
            }
        }
        for (role, why) in [
            (
                "Client",
                "it is the address published to consumers in status.endpoints",
            ),
            (
                "Admin",
                "it is where the operator reads the store's health and capacity",
            ),
        ] {
            if !seen.contains(role) {
                self.required(path, format!("an entry named {role:?} is required: {why}"));
            }
        }
    }

    /// O1: every object name the backend renders must be a DNS-1035 label. Only names the old
    /// object did not already render are checked.
    fn names(&mut self, new: &KVCacheBackend, old_managed: Option<&Managed>) {
        let Some(name) = new.metadata.name.as_deref().filter(|n| !n.is_empty()) else {
            self.required(
                "metadata.name",
                "a backend needs a name: its workloads are named after it",
            );
            return;
        };
        let Some(managed) = &new.spec.connection.managed else {
            return;
        };
        if over_member_limit(managed) {
            return;
        }
        let mut rendered = Vec::new();
        if old_managed.is_none() {
            rendered.push(names::leader_name(name));
        }
        let already = old_managed.map_or(0, |m| m.members.len());
        for i in already..managed.members.len() {
            rendered.push(names::member_name(name, i));
        }
        if let Some((object, problem)) = rendered
            .iter()
            .find_map(|object| names::dns1035_label_problem(object).map(|p| (object, p)))
        {
            self.invalid(
                "metadata.name",
                format!(
                    "this backend renders an object named {object:?}, which is not a valid name for one \
                     ({problem}): Services and the instance label need a DNS-1035 label, so the backend's \
                     name must leave room for \"-leader\" and \"-member-<index>\" within 63 lower-case \
                     letters, digits and '-'"
                ),
            );
        }
    }

    /// L1-L10.
    fn leader(
        &mut self,
        leader: &Leader,
        old: Option<&Leader>,
        old_object: Option<&KVCacheBackend>,
    ) {
        let replicas_path = format!("{LEADER_PATH}.replicas");
        if leader.replicas > MAX_LEADER_REPLICAS {
            self.invalid(
                &replicas_path,
                format!(
                    "at most {MAX_LEADER_REPLICAS} is supported: only one leader serves at a time, and more \
                     replicas only add Pods waiting for the election"
                ),
            );
        } else if leader.replicas < 1 {
            self.invalid(
                &replicas_path,
                "must be at least 1: a backend without a leader serves nothing",
            );
        }
        if leader.replicas > 1 && leader.high_availability.is_none() {
            self.forbidden(&replicas_path, messages::LEADER_REPLICAS_NEED_HA);
        }

        // L3, ratcheted on snapshot and replicas.
        let snapshot = leader
            .high_availability
            .as_ref()
            .and_then(|ha| ha.snapshot.as_ref());
        if snapshot.is_some() {
            let old_snapshot = old
                .and_then(|l| l.high_availability.as_ref())
                .and_then(|ha| ha.snapshot.as_ref());
            let moved =
                old.is_none_or(|l| l.replicas != leader.replicas) || old_snapshot != snapshot;
            if moved {
                self.forbidden(
                    format!("{LEADER_PATH}.highAvailability.snapshot"),
                    "snapshots are not supported: a leader restoring one can answer a key with bytes that \
                     belong to another key instead of reporting a miss. Remove the snapshot block",
                );
            }
        }

        // L10: multi-tenancy may be turned on (the leader gets its tenant-quota policy), but not
        // off while consumers hold the backend.
        let tenancy_path = format!("{LEADER_PATH}.multiTenancy");
        let was_on = old.is_some_and(|l| l.multi_tenancy == Some(true));
        let is_on = leader.multi_tenancy == Some(true);
        if was_on && !is_on {
            let consumers = old_object
                .and_then(|o| o.status.as_ref())
                .and_then(|s| s.used_by.as_ref())
                .filter(|u| !u.is_empty());
            if let Some(consumers) = consumers {
                let mut named: Vec<String> = consumers
                    .iter()
                    .take(MAX_NAMED_CONSUMERS)
                    .map(|c| {
                        if c.namespace.is_empty() {
                            format!("{}/{}", c.kind, c.name)
                        } else {
                            format!("{}/{}/{}", c.kind, c.namespace, c.name)
                        }
                    })
                    .collect();
                if consumers.len() > MAX_NAMED_CONSUMERS {
                    named.push(format!(
                        "and {} more",
                        consumers.len() - MAX_NAMED_CONSUMERS
                    ));
                }
                let verb = if consumers.len() == 1 {
                    "consumes"
                } else {
                    "consume"
                };
                self.forbidden(
                    &tenancy_path,
                    format!(
                        "multi-tenancy cannot be turned off while {} {verb} this backend: their keys live in \
                         tenant key spaces that would merge into one. Remove them first",
                        named.join(", ")
                    ),
                );
            }
        }

        // L4-L9, ratcheted on the lists and on highAvailability.
        let ha_moved = old.is_none_or(|l| {
            l.high_availability.is_some() != leader.high_availability.is_some()
                || l.high_availability.as_ref().map(|h| &h.snapshot)
                    != leader.high_availability.as_ref().map(|h| &h.snapshot)
        });
        let args_moved = ha_moved || old.is_none_or(|l| l.extra_args != leader.extra_args);
        if args_moved && let Some(args) = &leader.extra_args {
            self.extra_args(
                &format!("{LEADER_PATH}.extraArgs"),
                args,
                &LEADER_DERIVED_KEYS,
                &LEADER_FORBIDDEN_KEYS,
                leader_derived_reason,
            );
        }
        let env_moved = ha_moved || old.is_none_or(|l| l.extra_env != leader.extra_env);
        if env_moved && let Some(env) = &leader.extra_env {
            self.extra_env(
                &format!("{LEADER_PATH}.extraEnv"),
                env,
                &LEADER_DERIVED_ENVS,
                leader_env_reason,
            );
        }
    }

    fn extra_args(
        &mut self,
        path: &str,
        args: &[String],
        derived: &[&str],
        forbidden: &[(&str, &str)],
        derived_reason: fn(&str) -> String,
    ) {
        let mut first_at: BTreeMap<&str, usize> = BTreeMap::new();
        for (j, entry) in args.iter().enumerate() {
            let entry_path = format!("{path}[{j}]");
            if !entry.starts_with('-') {
                self.invalid(
                    entry_path,
                    "must begin with \"-\": one entry is one \"-flag\" or \"-flag=value\" token, passed on as \
                     written",
                );
                continue;
            }
            let key = entry_key(entry);
            if key.is_empty() || key.chars().any(char::is_whitespace) {
                self.invalid(
                    entry_path,
                    format!(
                        "the key here ({}) is not a setting's name: the key is the text between the \
                         leading dashes and the first \"=\", and must be non-empty and without whitespace",
                        shown(key)
                    ),
                );
                continue;
            }
            if let Some(first) = first_at.get(key) {
                self.push(
                    entry_path,
                    FieldErrorKind::Duplicate,
                    format!(
                        "sets the key {} a second time (first in entry {first}): only the last one takes \
                         effect, so the other reads as applied while it is not",
                        shown(key)
                    ),
                );
                continue;
            }
            first_at.insert(key, j);
            if derived.contains(&key) {
                self.forbidden(entry_path, derived_reason(key));
            } else if let Some((_, why)) = forbidden.iter().find(|(k, _)| *k == key) {
                self.forbidden(entry_path, format!("the key {key:?} is refused: {why}"));
            }
        }
    }

    fn extra_env(
        &mut self,
        path: &str,
        env: &[EnvEntry],
        derived: &[&str],
        reason: fn(&str) -> String,
    ) {
        let mut seen = BTreeSet::new();
        for entry in env {
            // The name is user input inside the path: escaped and bounded.
            let entry_path = text::path(&format!("{path}[{}]", entry.name));
            if let Some(problem) = names::env_name_problem(&entry.name) {
                self.invalid(
                    &entry_path,
                    format!(
                        "{} is not an environment variable name: {problem}",
                        shown(&entry.name)
                    ),
                );
                continue;
            }
            if !seen.insert(entry.name.as_str()) {
                self.push(
                    &entry_path,
                    FieldErrorKind::Duplicate,
                    "is defined twice: one name has one value",
                );
                continue;
            }
            if derived.contains(&entry.name.as_str()) {
                self.forbidden(&entry_path, reason(&entry.name));
            }
        }
    }

    fn members(&mut self, managed: &Managed, old: Option<&Managed>) {
        let members = &managed.members;
        if members.is_empty() {
            self.required(
                MEMBERS_PATH,
                "at least one member group is required: the leader alone stores nothing",
            );
        }
        // The CRD's item limit first: past it the API server refuses the object before any rule
        // runs, and the per-group rules (and the comparisons with the old groups) are skipped.
        if over_member_limit(managed) {
            self.push(
                MEMBERS_PATH,
                FieldErrorKind::TooMany,
                too_many(members.len(), MAX_MEMBERS),
            );
            return;
        }
        let old_members = old.map(|m| m.members.as_slice()).unwrap_or_default();
        for (i, group) in members.iter().enumerate() {
            self.group(i, group, old_members.get(i));
        }

        // T1: one tier per backend.
        let tiered: Vec<usize> = members
            .iter()
            .enumerate()
            .filter(|(_, g)| has_tier(g))
            .map(|(i, _)| i)
            .collect();
        if let [_, second, ..] = tiered.as_slice() {
            let list: Vec<String> = tiered.iter().map(ToString::to_string).collect();
            self.forbidden(
                format!("{}.localDisks", member_path(*second)),
                format!(
                    "{} (groups [{}] declare it)",
                    messages::ONE_TIER_GROUP,
                    list.join(" ")
                ),
            );
        }

        if old.is_some() {
            self.transitions(members, old_members);
        }

        if let Some(scale_in) = &managed.scale_in
            && let Some(grace) = scale_in.grace_period_seconds
        {
            let path = format!("{MANAGED_PATH}.scaleIn.gracePeriodSeconds");
            if grace > MAX_GRACE_PERIOD_SECONDS {
                self.invalid(
                    path,
                    format!(
                        "must not exceed {MAX_GRACE_PERIOD_SECONDS}: the member's unmount endpoint answers a longer \
                         grace with a 400, so the rendered shutdown hook would fail every time it runs"
                    ),
                );
            } else if grace < 0 {
                self.invalid(path, "must not be negative: it is a number of seconds");
            }
        }
    }

    /// T2-T4, M9 and M10: what an update may do to the groups at existing positions.
    fn transitions(&mut self, members: &[MemberGroup], old_members: &[MemberGroup]) {
        for (i, (new, old)) in members.iter().zip(old_members).enumerate() {
            let path = member_path(i);
            if new.medium != old.medium {
                self.invalid(format!("{path}.medium"), messages::MEDIUM_IMMUTABLE);
            }
            match (old.local_disk(), new.local_disk()) {
                (None, Some(_)) => {
                    self.forbidden(format!("{path}.localDisks"), messages::TIER_CANNOT_BE_ADDED)
                }
                (Some(_), None) => self.forbidden(
                    format!("{path}.localDisks"),
                    messages::TIER_CANNOT_BE_REMOVED,
                ),
                (Some(old_tier), Some(new_tier)) if old_tier.path != new_tier.path => self
                    .forbidden(
                        format!("{path}.localDisks[0].path"),
                        messages::TIER_PATH_IMMUTABLE,
                    ),
                _ => {}
            }
        }

        // M10: a group that moved to another position. Reported once, at the first such position.
        // The old groups that left their position are indexed by their canonical form, so each
        // new position is one lookup rather than a walk over every old group.
        let key = |group: &MemberGroup| serde_json::to_string(&canonical(group)).ok();
        let new_keys: Vec<Option<String>> = members.iter().map(key).collect();
        let old_keys: Vec<Option<String>> = old_members.iter().map(key).collect();
        let same = |a: &Option<String>, b: &Option<String>| {
            count_work(1);
            a.is_some() && a == b
        };
        let mut departed: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (j, old_key) in old_keys.iter().enumerate() {
            let left = new_keys
                .get(j)
                .is_none_or(|new_key| !same(new_key, old_key));
            if left && let Some(old_key) = old_key {
                departed.entry(old_key.as_str()).or_default().push(j);
            }
        }
        for (i, new_key) in new_keys.iter().enumerate().take(old_keys.len()) {
            if same(new_key, &old_keys[i]) {
                continue;
            }
            let Some(new_key) = new_key else { continue };
            // Ascending; position i itself is in the list only when its old group left too.
            let moved_from = departed
                .get(new_key.as_str())
                .and_then(|js| js.iter().copied().find(|&j| j != i));
            if let Some(j) = moved_from {
                self.forbidden(
                    member_path(i),
                    format!(
                        "this position now carries the group that was at position {j}, which moves a group \
                         rather than editing one: a group is identified by its position (its DaemonSet, \
                         medium and tier are tied to it). Append groups at the end and remove them from the \
                         end; to take a group out of service in place, narrow its nodeSelector until it \
                         matches no node"
                    ),
                );
                break;
            }
        }
    }

    fn group(&mut self, i: usize, group: &MemberGroup, old: Option<&MemberGroup>) {
        let path = member_path(i);

        // M1, M2, M3 on capacityPerMember.
        let capacity_path = format!("{path}.capacityPerMember");
        if let Some(amount) = self.quantity(&capacity_path, &group.capacity_per_member.0) {
            if !amount.is_positive() {
                self.invalid(&capacity_path, messages::CAPACITY_PER_MEMBER_POSITIVE);
            } else if has_tier(group) && amount.cmp_int(BUCKET_SIZE_FLOOR_BYTES).is_lt() {
                let moved = old
                    .is_none_or(|o| quantity::parse(&o.capacity_per_member).ok() != Some(amount));
                if moved {
                    self.invalid(
                        &capacity_path,
                        "must be at least 16Mi for a group declaring localDisks: the tier is written one 16Mi \
                         bucket at a time, and a bucket's bytes wait in this memory segment until it is \
                         complete, so a smaller segment never completes one and the tier stays empty with \
                         nothing reporting it",
                    );
                }
            }
        }

        // M4 on localBufferSize, and the memory request it adds up to.
        if let Some(buffer) = &group.local_buffer_size {
            let buffer_path = format!("{path}.localBufferSize");
            if let Some(amount) = self.quantity(&buffer_path, &buffer.0) {
                if amount.is_negative() {
                    self.invalid(&buffer_path, messages::LOCAL_BUFFER_NOT_NEGATIVE);
                } else if group.medium == Medium::Dram
                    && let (Some(buffer), Ok(Some(segment))) = (
                        amount.ceil_i64(),
                        quantity::parse(&group.capacity_per_member).map(|a| a.ceil_i64()),
                    )
                    && buffer.checked_add(segment).is_none()
                {
                    self.invalid(
                        &buffer_path,
                        "together with capacityPerMember it must not exceed 9223372036854775807 (2^63-1) \
                         bytes: the sum is the member Pod's memory request",
                    );
                }
            }
        }

        // M5: node selector.
        for (key, value) in &group.node_selector {
            let key_path = text::path(&format!("{path}.nodeSelector[{key}]"));
            if let Some(problem) = names::label_key_problem(key) {
                self.invalid(
                    &key_path,
                    format!("{} is not a label key: {problem}", shown(key)),
                );
            }
            if let Some(problem) = names::label_value_problem(value) {
                self.invalid(
                    &key_path,
                    format!("{} is not a label value: {problem}", shown(value)),
                );
            }
        }

        // M6, M7, ratcheted on each list.
        if let Some(args) = &group.extra_args
            && old.is_none_or(|o| o.extra_args.as_ref() != Some(args))
        {
            self.extra_args(
                &format!("{path}.extraArgs"),
                args,
                &MEMBER_DERIVED_KEYS,
                &[],
                member_derived_reason,
            );
        }
        if let Some(env) = &group.extra_env
            && old.is_none_or(|o| o.extra_env.as_ref() != Some(env))
        {
            self.extra_env(
                &format!("{path}.extraEnv"),
                env,
                &MEMBER_DERIVED_ENVS,
                member_env_reason,
            );
        }

        if group.fabric_interface_count < 1 {
            self.invalid(
                format!("{path}.fabricInterfaceCount"),
                "must be at least 1: it is the number of fabric devices each member requests",
            );
        }
        if let Some(class) = &group.runtime_class_name
            && let Some(problem) = names::dns1123_subdomain_problem(class)
        {
            self.invalid(
                format!("{path}.runtimeClassName"),
                format!("is not a RuntimeClass name: {problem}"),
            );
        }

        // The tier.
        let disks = group.local_disks.as_deref().unwrap_or_default();
        if disks.len() > 1 {
            self.push(
                format!("{path}.localDisks"),
                FieldErrorKind::TooMany,
                "at most one entry is allowed: a group has at most one disk tier",
            );
        }
        let old_disks = old
            .and_then(|o| o.local_disks.as_deref())
            .unwrap_or_default();
        for (k, disk) in disks.iter().enumerate() {
            self.tier(&format!("{path}.localDisks[{k}]"), disk, old_disks.get(k));
        }

        // M8: host paths.
        if let Some(host_paths) = &group.host_paths {
            self.host_paths(&path, host_paths, group.local_disk(), old);
        }
    }

    /// Reads a quantity, refusing it at `path` when it is over the CRD's length, unreadable or
    /// beyond 2^63-1.
    fn quantity(&mut self, path: &str, text: &str) -> Option<Amount> {
        if text.len() > quantity::MAX_QUANTITY_LENGTH {
            self.push(
                path,
                FieldErrorKind::TooMany,
                too_long(quantity::MAX_QUANTITY_LENGTH),
            );
            return None;
        }
        match quantity::parse_str(text) {
            Err(err) => {
                self.invalid(
                    path,
                    format!("{err}: write a number with an optional suffix such as Mi, Gi or Ti"),
                );
                None
            }
            Ok(amount) if amount.cmp_int(i64::MAX).is_gt() => {
                self.invalid(
                    path,
                    "must not exceed 9223372036854775807 (2^63-1) bytes: the store reads sizes as signed 64-bit \
                     numbers",
                );
                None
            }
            Ok(amount) => Some(amount),
        }
    }

    /// P1-P6, C1-C5, E1-E4 for one tier entry.
    fn tier(&mut self, path: &str, disk: &LocalDisk, old: Option<&LocalDisk>) {
        let path_path = format!("{path}.path");
        // P1-P6, ratcheted: the path is frozen per position, so a path stored under older rules
        // is not re-judged by today's (the stored data already lives there).
        let path_unchanged = old.is_some_and(|o| o.path == disk.path);
        if !path_unchanged {
            if disk.path.len() > MAX_TIER_PATH_LENGTH {
                self.push(
                    &path_path,
                    FieldErrorKind::TooMany,
                    too_long(MAX_TIER_PATH_LENGTH),
                );
            } else if let Some((kind, reason)) = tier_path_problem(&disk.path) {
                self.push(&path_path, kind, reason);
            }
        }

        let capacity_path = format!("{path}.capacity");
        let capacity = disk
            .capacity
            .as_ref()
            .and_then(|c| self.quantity(&capacity_path, &c.0));
        // A capacity refused as unreadable or too large is not also reported as missing.
        let capacity_refused = disk.capacity.is_some() && capacity.is_none();
        if let Some(amount) = capacity {
            if amount.is_negative() {
                self.invalid(&capacity_path, messages::CAPACITY_NOT_NEGATIVE);
            } else if amount.is_positive() && amount.cmp_int(BUCKET_SIZE_FLOOR_BYTES).is_lt() {
                let old_amount = old
                    .and_then(|o| o.capacity.as_ref())
                    .and_then(|c| quantity::parse(c).ok());
                if old.is_none() || old_amount != Some(amount) {
                    self.invalid(
                        &capacity_path,
                        "must be at least 16Mi, which is one bucket: the store stops taking offload work as soon \
                         as one more bucket would not fit under this ceiling, so a smaller one means no offload \
                         at all",
                    );
                }
            }
        }

        let keys_path = format!("{path}.keyLimit");
        if let Some(keys) = disk.key_limit {
            if keys < 0 {
                self.invalid(
                    &keys_path,
                    "must not be negative: it caps how many keys the tier holds",
                );
            } else if keys > 0
                && keys < BUCKET_KEYS_FLOOR
                && old.is_none_or(|o| o.key_limit != disk.key_limit)
            {
                self.invalid(
                    &keys_path,
                    "must be at least 64, which is one bucket's worth of keys: the store stops taking offload \
                     work as soon as one more bucket would not fit under this limit, so a smaller one means no \
                     offload at all",
                );
            }
        }

        if let Some(eviction) = &disk.eviction {
            let eviction_path = format!("{path}.eviction");
            if !eviction.enabled && eviction.policy.is_some() {
                self.forbidden(
                    format!("{eviction_path}.policy"),
                    messages::POLICY_WHILE_DISABLED,
                );
            }
            if let Some(watermark) = &eviction.watermark {
                let mark_path = format!("{eviction_path}.watermark");
                if !eviction.enabled {
                    self.forbidden(&mark_path, messages::WATERMARK_WHILE_DISABLED);
                } else if !capacity_refused && !capacity.is_some_and(|c| c.is_positive()) {
                    self.required(&capacity_path, messages::WATERMARK_NEEDS_CAPACITY);
                }
                for (name, value) in [("high", watermark.high), ("low", watermark.low)] {
                    if !(1..=100).contains(&value) {
                        self.invalid(
                            format!("{mark_path}.{name}"),
                            "must be between 1 and 100: it is a percentage of capacity",
                        );
                    }
                }
                if watermark.low >= watermark.high {
                    self.invalid(
                        format!("{mark_path}.low"),
                        format!(
                            "{} (high is {})",
                            messages::WATERMARK_LOW_BELOW_HIGH,
                            watermark.high
                        ),
                    );
                }
            }
        }
    }

    /// M8 and the shape of each entry.
    fn host_paths(
        &mut self,
        group_path: &str,
        host_paths: &[HostPathMount],
        tier: Option<&LocalDisk>,
        old: Option<&MemberGroup>,
    ) {
        if host_paths.len() > MAX_LIST_ITEMS {
            // The CRD refuses the list before any rule runs; the entries are not compared.
            self.push(
                format!("{group_path}.hostPaths"),
                FieldErrorKind::TooMany,
                too_many(host_paths.len(), MAX_LIST_ITEMS),
            );
            return;
        }
        let tier_path = tier
            .filter(|t| tier_path_problem(&t.path).is_none())
            .map(|t| clean(&t.path));
        // The overlap with the tier is ratcheted: while the tier path is unchanged, a mount path
        // the old group already had is not re-judged against it.
        let tier_unchanged = tier.is_some_and(|t| {
            old.and_then(MemberGroup::local_disk)
                .is_some_and(|o| o.path == t.path)
        });
        let old_mounts: BTreeSet<&str> = if tier_unchanged {
            old.and_then(|o| o.host_paths.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|m| m.mount_path.as_str())
                .collect()
        } else {
            BTreeSet::new()
        };
        let mut shaped: Vec<(usize, String)> = Vec::new();
        for (j, entry) in host_paths.iter().enumerate() {
            let entry_path = format!("{group_path}.hostPaths[{j}]");
            let mut shape_ok = true;
            for (field, value, host) in [
                ("path", &entry.path, true),
                ("mountPath", &entry.mount_path, false),
            ] {
                if let Some(problem) = host_path_shape_problem(value, host) {
                    self.invalid(format!("{entry_path}.{field}"), problem);
                    shape_ok = false;
                }
            }
            if shape_ok {
                shaped.push((j, clean(&entry.mount_path)));
            }
        }
        let first_overlaps = first_earlier_overlaps(&shaped);
        for ((j, mount), first) in shaped.iter().zip(first_overlaps) {
            let mount_path = format!("{group_path}.hostPaths[{j}].mountPath");
            if let Some(k) = first {
                self.invalid(
                    &mount_path,
                    format!(
                        "overlaps the mount path of hostPaths[{k}] ({}): one mount would hide all or part \
                         of the other",
                        text::escape(&host_paths[k].mount_path)
                    ),
                );
            } else if overlaps(mount, INFINIBAND_DIR) {
                self.invalid(
                    &mount_path,
                    "overlaps /dev/infiniband, where a host fabric's device plugin puts the granted device \
                     nodes in this same container: one would hide the other",
                );
            } else if let Some(tier) = tier_path.as_deref()
                && overlaps(mount, tier)
                && !old_mounts.contains(host_paths[*j].mount_path.as_str())
            {
                self.invalid(
                    &mount_path,
                    format!(
                        "overlaps where this group's localDisks tier is mounted ({}): the two mounts would \
                         hide parts of each other",
                        text::escape(tier)
                    ),
                );
            }
        }
    }
}

/// Whether the member list is over the CRD's `maxItems`.
fn over_member_limit(managed: &Managed) -> bool {
    managed.members.len() > MAX_MEMBERS
}

/// Most member groups (`members` `maxItems`).
// `u32` to `usize` is lossless on every target this runs on.
const MAX_MEMBERS: usize = MAX_MEMBER_GROUPS as usize;

/// For each `(index, cleaned path)` in list order, the smallest index of an entry whose path
/// overlaps it (equal, containing or contained), when that index is smaller than its own.
///
/// In O(n log n) comparisons: the paths are sorted by component, so that every path is followed
/// directly by the paths it contains; a stack of the enclosing paths gives each its containers
/// (with the smallest index among them), and a backward pass the smallest index among what each
/// contains.
fn first_earlier_overlaps(entries: &[(usize, String)]) -> Vec<Option<usize>> {
    let components: Vec<Vec<&str>> = entries
        .iter()
        .map(|(_, p)| p.split('/').filter(|c| !c.is_empty()).collect())
        .collect();
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        components[a]
            .cmp(&components[b])
            .then(entries[a].0.cmp(&entries[b].0))
    });
    let contains = |outer: usize, inner: usize| {
        count_work(1);
        components[inner].starts_with(&components[outer])
    };
    // Smallest index among the entries that contain (or equal) each one, itself excluded.
    let mut above: Vec<Option<usize>> = vec![None; entries.len()];
    // Each sorted position's parent (the nearest containing entry) and the smallest index of
    // what it contains.
    let mut parent: Vec<Option<usize>> = vec![None; entries.len()];
    let mut below: Vec<Option<usize>> = vec![None; entries.len()];
    let mut stack: Vec<(usize, Option<usize>)> = Vec::new(); // (sorted entry, min index on stack)
    for &e in &order {
        while let Some(&(top, _)) = stack.last() {
            if contains(top, e) {
                break;
            }
            stack.pop();
        }
        if let Some(&(top, min)) = stack.last() {
            above[e] = min;
            parent[e] = Some(top);
        }
        let min_here = above[e].map_or(entries[e].0, |m| m.min(entries[e].0));
        stack.push((e, Some(min_here)));
    }
    for &e in order.iter().rev() {
        if let Some(p) = parent[e] {
            let candidate = below[e].map_or(entries[e].0, |m| m.min(entries[e].0));
            below[p] = Some(below[p].map_or(candidate, |m| m.min(candidate)));
        }
    }
    (0..entries.len())
        .map(|e| {
            let own = entries[e].0;
            [above[e], below[e]]
                .into_iter()
                .flatten()
                .filter(|k| *k < own)
                .min()
        })
        .collect()
}

/// Counts units of work in tests, so that complexity is asserted by counting rather than timing.
#[cfg(test)]
fn count_work(units: u64) {
    WORK.with(|w| w.set(w.get() + units));
}

#[cfg(not(test))]
fn count_work(_units: u64) {}

#[cfg(test)]
thread_local! {
    static WORK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn leader_derived_reason(key: &str) -> String {
    match key {
        "enable_offload" | "offload_on_evict" => format!(
            "the key {key:?} is derived from this spec: the operator renders -enable_offload=true and \
             -offload_on_evict=true together exactly when a member group declares localDisks, so that the \
             leader cannot drift out of step with the members' declaration"
        ),
        _ => format!(
            "the key {key:?} is derived from a field of this spec, and two sources for one setting make the \
             rendered command line ambiguous; set the field instead"
        ),
    }
}

fn member_derived_reason(key: &str) -> String {
    format!(
        "the key {key:?} is derived from this spec (it is rendered into the member's environment), and two \
         sources for one setting make the result depend on which one the store reads last; set the field \
         instead"
    )
}

fn leader_env_reason(name: &str) -> String {
    format!(
        "{name} is rendered by the operator for the leader, and a second definition of one name leaves the \
         winner to the container runtime, with nothing reporting the clash"
    )
}

fn member_env_reason(name: &str) -> String {
    if BUCKET_ENVS.contains(&name) {
        format!(
            "{name} is rendered from this spec: the operator fixes the bucket size at 16777216 bytes and 64 \
             keys so that a modest backend closes buckets and writes its tier. Moving them is a tuning \
             decision that would need a field, and a second definition leaves the winner to the container \
             runtime, with nothing reporting the clash"
        )
    } else {
        format!(
            "{name} is rendered from this spec, and a second definition of one name leaves the winner to the \
             container runtime, with nothing reporting the clash"
        )
    }
}

/// The key of an `extraArgs` entry: the text after the leading dashes, up to the first `=`.
pub fn entry_key(entry: &str) -> &str {
    let flag = entry.trim_start_matches('-');
    flag.split_once('=').map_or(flag, |(key, _)| key)
}

/// Whether the group declares a (non-empty) tier.
pub fn has_tier(group: &MemberGroup) -> bool {
    group.local_disk().is_some()
}

/// The first of P1-P6 that `path` breaks, with its kind and reason.
pub fn tier_path_problem(path: &str) -> Option<(FieldErrorKind, String)> {
    if path.trim().is_empty() {
        return Some((
            FieldErrorKind::Required,
            "a directory on the node is required: it is mounted from the host, and the operator picks no \
             default, because the wrong host directory fills a filesystem that nothing in Kubernetes accounts \
             for"
                .into(),
        ));
    }
    if path.trim() != path {
        return Some((
            FieldErrorKind::Invalid,
            "must not begin or end with whitespace: the directory is mounted exactly as written, so a stray \
             space names a different directory than the one you read"
                .into(),
        ));
    }
    if !path.starts_with('/') {
        return Some((
            FieldErrorKind::Invalid,
            "must be an absolute path: it names a directory on the node, and the kubelet would refuse a \
             relative one only when the member Pod starts"
                .into(),
        ));
    }
    if path.split('/').any(|component| component == "..") {
        return Some((
            FieldErrorKind::Invalid,
            "must not contain a \"..\" component: the store refuses such a path as traversal before it checks \
             that the directory exists, so the member would run without ever mounting its tier"
                .into(),
        ));
    }
    let cleaned = clean(path);
    if cleaned == "/" {
        return Some((
            FieldErrorKind::Invalid,
            "must not be the root directory: that would mount the node's whole filesystem into the store's \
             container"
                .into(),
        ));
    }
    if overlaps(&cleaned, INFINIBAND_DIR) {
        return Some((
            FieldErrorKind::Invalid,
            "must not overlap /dev/infiniband (be it, lie inside it or contain it): a host fabric's device \
             plugin puts the granted device nodes there in this same container, and the tier would hide them or \
             be hidden by them, whatever spec.transport.protocol says today"
                .into(),
        ));
    }
    None
}

/// Why a `hostPaths[].path` (`host` true) or `mountPath` breaks the CRD's shape (at most 1024
/// characters of `^(/[^/]+)+$`), or why Kubernetes would refuse the host path: it refuses a
/// hostPath volume whose path has a `..` component. A mount path is compared after cleaning
/// (`.` and `..` resolved, as upstream's `filepath.Clean`), so neither component is an error
/// there, nor `.` in a host path.
fn host_path_shape_problem(value: &str, host: bool) -> Option<String> {
    if value.len() > MAX_HOST_PATH_LENGTH {
        return Some(too_long(MAX_HOST_PATH_LENGTH));
    }
    let mut components = value.split('/').skip(1);
    if !value.starts_with('/') || components.any(str::is_empty) {
        return Some(
            "must be an absolute path without empty components or a trailing \"/\" (like /var/run/x)".into(),
        );
    }
    if host && value.split('/').any(|c| c == "..") {
        return Some(
            "must not contain a \"..\" component: Kubernetes refuses a hostPath volume with one, so every \
             member Pod of the group would be refused"
                .into(),
        );
    }
    None
}

/// `path` cleaned as Go's `path.Clean` cleans an absolute path: empty and `.` components
/// dropped, each `..` removing the component before it (and nothing at the root).
pub fn clean(path: &str) -> String {
    let mut components: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                components.pop();
            }
            c => components.push(c),
        }
    }
    format!("/{}", components.join("/"))
}

/// Whether two clean absolute paths are equal or one contains the other, component-wise.
pub fn overlaps(a: &str, b: &str) -> bool {
    let parts = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (a, b) = (parts(a), parts(b));
    let shorter = a.len().min(b.len());
    a[..shorter] == b[..shorter]
}

/// The group with every quantity in canonical form, so that groups equal as quantities compare
/// equal (`16Mi` and `16384Ki`).
fn canonical(group: &MemberGroup) -> MemberGroup {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let canon = |q: &Quantity| match quantity::parse(q) {
        Ok(amount) => Quantity(amount.to_string()),
        Err(_) => q.clone(),
    };
    let mut group = group.clone();
    group.capacity_per_member = canon(&group.capacity_per_member);
    group.local_buffer_size = group.local_buffer_size.as_ref().map(canon);
    if let Some(disks) = &mut group.local_disks {
        for disk in disks {
            disk.capacity = disk.capacity.as_ref().map(canon);
        }
    }
    group
}

/// Why `address` is not `host:port` as the operator dials it, or `Ok`: no surrounding
/// whitespace, Go's `net.SplitHostPort` splits it into a non-empty host and a port that
/// `strconv.Atoi` reads as 1 to 65535, and Go's `url.Parse("http://" + address + "/")` gives it
/// back unchanged as the URL's host (no path, query, fragment, user name, escapes or characters
/// a host may not have; an address in brackets must be an IPv6 address).
pub fn host_port_problem(address: &str) -> Result<(), String> {
    if address.trim() != address {
        return Err(
            "must not begin or end with whitespace: the address is stored and dialled exactly as written".into(),
        );
    }
    let (host, port) = split_host_port(address)?;
    if host.is_empty() {
        return Err("no host".into());
    }
    let number = atoi(port).ok_or_else(|| format!("port {} is not a number", shown(port)))?;
    if !(1..=65535).contains(&number) {
        return Err(format!("port {number} is outside 1-65535"));
    }
    url_host_problem(address)
}

/// Go's `net.SplitHostPort`.
fn split_host_port(address: &str) -> Result<(&str, &str), String> {
    let fail = |why: &str| Err(format!("address {}: {why}", shown(address)));
    let Some(last_colon) = address.rfind(':') else {
        return fail("missing port in address");
    };
    let (host, skip_open, skip_close) = if address.starts_with('[') {
        let Some(end) = address.find(']') else {
            return fail("missing ']' in address");
        };
        if end + 1 == address.len() {
            return fail("missing port in address");
        } else if end + 1 != last_colon {
            if address.as_bytes().get(end + 1) == Some(&b':') {
                return fail("too many colons in address");
            }
            return fail("missing port in address");
        }
        (&address[1..end], 1, end + 1)
    } else {
        let host = &address[..last_colon];
        if host.contains(':') {
            return fail("too many colons in address");
        }
        (host, 0, 0)
    };
    if address[skip_open..].contains('[') {
        return fail("unexpected '[' in address");
    }
    if address[skip_close..].contains(']') {
        return fail("unexpected ']' in address");
    }
    Ok((host, &address[last_colon + 1..]))
}

/// Go's `strconv.Atoi`: an optional sign and decimal digits, within 64 bits.
fn atoi(text: &str) -> Option<i64> {
    let digits = text
        .strip_prefix('+')
        .or_else(|| text.strip_prefix('-'))
        .unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.strip_prefix('+').unwrap_or(text).parse().ok()
}

/// Why Go's `url.Parse("http://" + address + "/")` fails or reads a host other than `address`.
fn url_host_problem(address: &str) -> Result<(), String> {
    if let Some(c) = address.chars().find(|c| c.is_ascii_control()) {
        return Err(format!(
            "cannot be used as an address: it contains the control character {}",
            shown(&c.to_string())
        ));
    }
    // A fragment, a query, a path or a user name ends (or precedes) the URL's host.
    if let Some(c) = address.chars().find(|c| matches!(c, '#' | '?' | '/' | '@')) {
        return Err(format!(
            "is not read as the URL host it is written as: {} starts a {} there",
            shown(&c.to_string()),
            match c {
                '#' => "fragment",
                '?' => "query",
                '/' => "path",
                _ => "user name (everything before it)",
            }
        ));
    }
    if address.contains('%') {
        return Err(
            "cannot be used as an address: a host is not read with %-escapes unchanged".into(),
        );
    }
    let (host, port) = match address.strip_prefix('[') {
        Some(rest) => {
            let (ip, port) = rest
                .rsplit_once("]:")
                .ok_or("an address in brackets needs a port")?;
            if ip.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!(
                    "cannot be used as an address: {} in brackets is not an IPv6 address",
                    shown(ip)
                ));
            }
            (None, port)
        }
        None => {
            let (host, port) = address.rsplit_once(':').ok_or("no port")?;
            (Some(host), port)
        }
    };
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "cannot be used as an address: the URL parser refuses the port {}",
            shown(port)
        ));
    }
    // The characters a URL host may carry unescaped: letters, digits, "-._~", the sub-delimiters
    // and the few Go adds; any non-ASCII character.
    if let Some(host) = host
        && let Some(c) = host.chars().find(|c| {
            c.is_ascii()
                && !(c.is_ascii_alphanumeric()
                    || matches!(
                        c,
                        '-' | '.'
                            | '_'
                            | '~'
                            | '!'
                            | '$'
                            | '&'
                            | '\''
                            | '('
                            | ')'
                            | '*'
                            | '+'
                            | ','
                            | ';'
                            | '='
                            | '<'
                            | '>'
                            | '"'
                    ))
        })
    {
        return Err(format!(
            "cannot be used as an address: a URL host may not contain {}",
            shown(&c.to_string())
        ));
    }
    Ok(())
}

/// Checks the operator's default image (`--default-image`, `KV_CACHE_BACKEND_IMAGE`: the
/// `kv-cache-backend-image` setting) with exactly the rules of `spec.image`: at most 512 bytes as
/// given, then trimmed, not blank, and an image reference both upstream's parser and the
/// kubelet take. The value is rendered trimmed. `Err` says why, with the value shown bounded and
/// escaped; call it at startup, before the value decides anything.
pub fn check_default_image(value: &str) -> Result<(), String> {
    let why = if value.len() > MAX_IMAGE_LENGTH {
        too_long(MAX_IMAGE_LENGTH)
    } else if value.trim().is_empty() {
        "must not be blank: name an image, or leave the setting out so that every managed backend names \
         its own"
            .to_owned()
    } else if let Err(problem) = image::parse(value.trim()) {
        format!("is not a container image reference ({problem})")
    } else {
        return Ok(());
    };
    Err(format!("the default image {}: {why}", shown(value)))
}

/// An image field as upstream reads it: an empty string is an unset field.
fn unset_if_empty(image: Option<&str>) -> Option<&str> {
    image.filter(|i| !i.is_empty())
}

/// The CRD's refusal of a string over `max` bytes, in the API server's words.
pub fn too_long(max: usize) -> String {
    format!("Too long: may not be more than {max} bytes")
}

/// The CRD's refusal of a list over `max` items, in the API server's words.
pub fn too_many(count: usize, max: usize) -> String {
    format!("Too many: {count}: must have at most {max} items")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tiered_value(medium: &str, capacity: &str) -> Value {
        json!({
            "apiVersion": "worker.gpustack.ai/v1alpha1",
            "kind": "KVCacheBackend",
            "metadata": {"name": "kvc", "finalizers": ["worker.gpustack.ai/kvcache"]},
            "spec": {"image": "repo/store:1", "connection": {"managed": {"leader": {}, "members": [
                {"nodeSelector": {}, "medium": medium, "capacityPerMember": capacity,
                 "localDisks": [{"path": "/var/lib/kvcache"}]}
            ]}}},
        })
    }

    #[test]
    fn values_admit_an_unchanged_spec_before_decoding_anything() {
        let ctx = ValidationContext::default();
        // Stored by a newer operator: a medium this one does not know, and a spec that today's
        // rules refuse (8Mi under a tier).
        let stored = tiered_value("HBM", "8Mi");
        let mut released = stored.clone();
        released["metadata"]["finalizers"] = json!([]);
        assert_eq!(validate_values(&released, Some(&stored), &ctx), Ok(vec![]));

        // A spec change of that object: the new object's own shape problem is the refusal.
        let mut edited = stored.clone();
        edited["spec"]["image"] = json!("repo/store:2");
        let errors = validate_values(&edited, Some(&stored), &ctx).unwrap();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "spec.connection.managed.members[0].medium");

        // A spec change whose new object decodes, of a stored object that does not: no verdict.
        let fixed = tiered_value("DRAM", "1Gi");
        let err = validate_values(&fixed, Some(&stored), &ctx).unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(err.0[0].path, "spec.connection.managed.members[0].medium");

        // Create: no shortcut, the rules apply.
        let errors = validate_values(&tiered_value("DRAM", "8Mi"), None, &ctx).unwrap();
        assert_eq!(
            errors[0].path,
            "spec.connection.managed.members[0].capacityPerMember"
        );
        assert_eq!(validate_values(&fixed, None, &ctx), Ok(vec![]));
    }

    #[test]
    fn values_ignore_fields_of_the_stored_object_this_api_does_not_have() {
        let ctx = ValidationContext::default();
        let mut stored = tiered_value("DRAM", "1Gi");
        stored["spec"]["connection"]["managed"]["futureField"] = json!(true);
        let edited = tiered_value("DRAM", "2Gi");
        assert_eq!(validate_values(&edited, Some(&stored), &ctx), Ok(vec![]));
        // In the new object the same field is refused.
        let errors = validate_values(&stored, None, &ctx).unwrap();
        assert_eq!(errors[0].path, "spec.connection.managed.futureField");
    }

    fn typed(value: Value) -> KVCacheBackend {
        from_value(value).unwrap()
    }

    fn with_tier_path(capacity: &str, path: &str) -> Value {
        let mut value = tiered_value("DRAM", capacity);
        value["spec"]["connection"]["managed"]["members"][0]["localDisks"][0]["path"] = json!(path);
        value
    }

    #[test]
    fn tier_path_rules_are_ratcheted_per_position() {
        let ctx = ValidationContext::default();
        let path_field = "spec.connection.managed.members[0].localDisks[0].path";
        // Admitted by an older operator, refused by today's rule.
        let stored = typed(with_tier_path("1Gi", "/dev/infiniband/x"));
        let created = validate(&stored, None, &ctx);
        assert_eq!(created.len(), 1, "{created:?}");
        assert_eq!(created[0].path, path_field);
        // An update that changes only the capacity: admitted.
        let resized = typed(with_tier_path("2Gi", "/dev/infiniband/x"));
        assert_eq!(validate(&resized, Some(&stored), &ctx), vec![]);
        // Moving the path is refused (frozen), and the new path is checked again.
        let moved = typed(with_tier_path("2Gi", "/dev/infiniband/y"));
        let errors = validate(&moved, Some(&stored), &ctx);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().all(|e| e.path == path_field));
        // The ratchet is per position: the same path in an appended group is checked.
        let mut appended = with_tier_path("2Gi", "/dev/infiniband/x");
        let mut plain = appended["spec"]["connection"]["managed"]["members"][0].clone();
        plain.as_object_mut().unwrap().remove("localDisks");
        appended["spec"]["connection"]["managed"]["members"]
            .as_array_mut()
            .unwrap()
            .insert(0, plain);
        let errors = validate(&typed(appended), Some(&stored), &ctx);
        assert!(
            errors.iter().any(|e| e.path
                == "spec.connection.managed.members[1].localDisks[0].path"
                && e.reason.contains("/dev/infiniband")),
            "{errors:?}"
        );
    }

    #[test]
    fn host_path_overlap_with_an_unchanged_tier_is_ratcheted_per_entry() {
        let ctx = ValidationContext::default();
        let with_host_paths = |capacity: &str, mounts: &[&str]| {
            let mut value = with_tier_path(capacity, "/var/lib/kvcache");
            let entries: Vec<Value> = mounts
                .iter()
                .map(|m| json!({"path": "/srv/extra", "mountPath": m}))
                .collect();
            value["spec"]["connection"]["managed"]["members"][0]["hostPaths"] = json!(entries);
            typed(value)
        };
        // Stored by an operator that did not yet check this overlap.
        let stored = with_host_paths("1Gi", &["/var/lib/kvcache/extra"]);
        let created = validate(&stored, None, &ctx);
        assert_eq!(created.len(), 1, "{created:?}");
        assert_eq!(
            created[0].path,
            "spec.connection.managed.members[0].hostPaths[0].mountPath"
        );
        let resized = with_host_paths("2Gi", &["/var/lib/kvcache/extra"]);
        assert_eq!(validate(&resized, Some(&stored), &ctx), vec![]);
        // A new entry overlapping the tier is still refused.
        let added = with_host_paths("2Gi", &["/var/lib/kvcache/extra", "/var/lib/kvcache/more"]);
        let errors = validate(&added, Some(&stored), &ctx);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].path,
            "spec.connection.managed.members[0].hostPaths[1].mountPath"
        );
    }

    #[test]
    fn path_rules_in_order() {
        let kind = tier_path_problem;
        assert!(kind("/var/lib/kvcache").is_none());
        assert!(kind("/dev/infiniband-cache").is_none());
        assert!(kind("/mnt/..data/kv").is_none());
        assert_eq!(kind("   ").unwrap().0, FieldErrorKind::Required);
        assert_eq!(kind("").unwrap().0, FieldErrorKind::Required);
        assert!(kind(" /x").unwrap().1.contains("whitespace"));
        assert!(kind("/x\n").unwrap().1.contains("whitespace"));
        // Whitespace is reported before "not absolute".
        assert!(kind(" x").unwrap().1.contains("whitespace"));
        assert!(kind("x/..").unwrap().1.contains("absolute"));
        assert!(kind("/var/../kv").unwrap().1.contains(".."));
        assert!(kind("/..").unwrap().1.contains(".."));
        assert!(kind("/").unwrap().1.contains("root"));
        assert!(kind("//").unwrap().1.contains("root"));
        assert!(kind("/./").unwrap().1.contains("root"));
        for p in [
            "/dev/infiniband",
            "/dev/infiniband/x",
            "/dev",
            "/dev/",
            "//dev//infiniband/",
        ] {
            assert!(kind(p).unwrap().1.contains("/dev/infiniband"), "{p}");
        }
    }

    #[test]
    fn host_paths_are_cleaned_before_they_are_compared() {
        // "." is no error in either field; ".." is refused in the host path (Kubernetes refuses
        // the volume) and resolved in the mount path.
        assert_eq!(host_path_shape_problem("/srv/./data", true), None);
        assert_eq!(host_path_shape_problem("/srv/./data", false), None);
        assert_eq!(host_path_shape_problem("/srv/../data", false), None);
        assert!(host_path_shape_problem("/srv/../data", true).is_some());
        assert!(host_path_shape_problem("/srv//data", false).is_some());
        assert!(host_path_shape_problem("/srv/", false).is_some());
        assert_eq!(clean("/srv/./data"), "/srv/data");
        assert_eq!(clean("/a/../dev/./infiniband"), "/dev/infiniband");
        assert_eq!(clean("/.."), "/");
        let ctx = ValidationContext::default();
        let with_mounts = |mounts: &[&str]| {
            let entries: Vec<Value> = mounts
                .iter()
                .map(|m| json!({"path": "/srv/extra", "mountPath": m}))
                .collect();
            let mut value = tiered_value("DRAM", "1Gi");
            value["spec"]["connection"]["managed"]["members"][0]["hostPaths"] = json!(entries);
            typed(value)
        };
        assert_eq!(
            validate(&with_mounts(&["/opt/./a", "/opt/b"]), None, &ctx),
            vec![]
        );
        let errors = validate(&with_mounts(&["/opt/a", "/opt/./a/b"]), None, &ctx);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].reason.contains("hostPaths[0]"), "{errors:?}");
        let errors = validate(&with_mounts(&["/x/../dev/infiniband"]), None, &ctx);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].reason.contains("/dev/infiniband"), "{errors:?}");
        let errors = validate(&with_mounts(&["/var/lib/./kvcache"]), None, &ctx);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].reason.contains("localDisks"), "{errors:?}");
    }

    fn work<T>(f: impl FnOnce() -> T) -> (T, u64) {
        WORK.with(|w| w.set(0));
        let out = f();
        (out, WORK.with(std::cell::Cell::get))
    }

    #[test]
    fn a_400k_digit_quantity_is_refused_by_its_length_before_it_is_read() {
        let ctx = ValidationContext::default();
        let value = tiered_value("DRAM", &format!("1{}", "0".repeat(400_000)));
        let started = std::time::Instant::now();
        let errors = validate_values(&value, None, &ctx).unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].path,
            "spec.connection.managed.members[0].capacityPerMember"
        );
        assert_eq!(errors[0].kind, FieldErrorKind::TooMany);
        assert_eq!(errors[0].reason, "Too long: may not be more than 64 bytes");
        // At the limit: read.
        let at_limit = format!("{}1Gi", "0".repeat(61));
        assert_eq!(at_limit.len(), 64);
        assert_eq!(
            validate_values(&tiered_value("DRAM", &at_limit), None, &ctx),
            Ok(vec![])
        );
    }

    #[test]
    fn host_paths_over_the_limit_are_refused_without_comparing_them() {
        let ctx = ValidationContext::default();
        let mut value = tiered_value("DRAM", "1Gi");
        let entries: Vec<Value> = (0..8000)
            .map(|i| json!({"path": "/srv/x", "mountPath": format!("/m/{i}")}))
            .collect();
        value["spec"]["connection"]["managed"]["members"][0]["hostPaths"] = json!(entries);
        let backend = typed(value);
        let (errors, units) = work(|| validate(&backend, None, &ctx));
        assert_eq!(errors.len(), 1, "{:?}", &errors[..errors.len().min(3)]);
        assert_eq!(
            errors[0].path,
            "spec.connection.managed.members[0].hostPaths"
        );
        assert_eq!(
            errors[0].reason,
            "Too many: 8000: must have at most 32 items"
        );
        assert_eq!(units, 0);
    }

    #[test]
    fn host_path_overlaps_at_the_limit_take_linearithmic_work() {
        let ctx = ValidationContext::default();
        let mut value = tiered_value("DRAM", "1Gi");
        // Nested and sibling paths mixed, deepest first.
        let entries: Vec<Value> = (0..32)
            .rev()
            .map(|i| {
                let nested: String = (0..=i % 8).map(|d| format!("/d{d}")).collect();
                json!({"path": "/srv/x", "mountPath": format!("/m{}{nested}", i / 8)})
            })
            .collect();
        value["spec"]["connection"]["managed"]["members"][0]["hostPaths"] = json!(entries);
        let backend = typed(value);
        let (errors, units) = work(|| validate(&backend, None, &ctx));
        // Four chains of eight nested paths: all but the first of each chain overlap.
        assert_eq!(errors.len(), 28, "{errors:?}");
        assert!(units <= 2 * 32, "{units} comparisons");
    }

    #[test]
    fn first_earlier_overlap_matches_the_pairwise_definition() {
        let sets: [&[&str]; 5] = [
            &["/a", "/a/b", "/b", "/a"],
            &["/a/b/c", "/a", "/a/b", "/x/y", "/x"],
            &["/ab", "/a", "/a/b", "/a-b", "/a/bc", "/a/b/c"],
            &["/z", "/y", "/x"],
            &["/", "/q", "/q/r"],
        ];
        for set in sets {
            let entries: Vec<(usize, String)> = set
                .iter()
                .enumerate()
                .map(|(i, p)| (i, (*p).to_owned()))
                .collect();
            let naive: Vec<Option<usize>> = entries
                .iter()
                .map(|(j, p)| {
                    entries[..*j]
                        .iter()
                        .find(|(_, q)| overlaps(p, q))
                        .map(|(k, _)| *k)
                })
                .collect();
            assert_eq!(first_earlier_overlaps(&entries), naive, "{set:?}");
        }
    }

    #[test]
    fn a_20000_group_update_is_refused_without_comparing_groups() {
        let ctx = ValidationContext::default();
        let group = |i: usize| json!({"nodeSelector": {"g": i.to_string()}, "medium": "DRAM", "capacityPerMember": "1Gi"});
        let with_groups = |n: usize, shift: usize| {
            let mut value = tiered_value("DRAM", "1Gi");
            let groups: Vec<Value> = (0..n).map(|i| group(i + shift)).collect();
            value["spec"]["connection"]["managed"]["members"] = json!(groups);
            typed(value)
        };
        let (old, new) = (with_groups(20_000, 0), with_groups(20_000, 1));
        let started = std::time::Instant::now();
        let (errors, units) = work(|| validate(&new, Some(&old), &ctx));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(errors.len(), 1, "{:?}", &errors[..errors.len().min(3)]);
        assert_eq!(errors[0].path, MEMBERS_PATH);
        assert_eq!(
            errors[0].reason,
            "Too many: 20000: must have at most 32 items"
        );
        assert_eq!(units, 0);
        // At the limit, a shift of every group is found with one lookup per position.
        let (old, new) = (with_groups(32, 0), with_groups(32, 1));
        let (errors, units) = work(|| validate(&new, Some(&old), &ctx));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].reason.contains("was at position 1"), "{errors:?}");
        assert!(units <= 2 * 32, "{units} comparisons");
    }

    #[test]
    fn the_default_image_is_checked_like_spec_image() {
        assert_eq!(
            check_default_image("docker.io/kvcacheai/mooncake:0.3.13"),
            Ok(())
        );
        // Trimmed, as spec.image is.
        assert_eq!(check_default_image(" repo/store:1\n"), Ok(()));
        for bad in [
            "repo/st ore:1",
            "repo/store\n:1",
            "",
            "   ",
            "Repo/store",
            "docker.io/a",
        ] {
            let err = check_default_image(bad).unwrap_err();
            assert!(err.starts_with("the default image \""), "{err}");
        }
        let huge = format!("repo/{}", "a".repeat(120 * 1024));
        let err = check_default_image(&huge).unwrap_err();
        assert!(
            err.contains("Too long: may not be more than 512 bytes"),
            "{err}"
        );
        // The value is echoed bounded and escaped.
        assert!(err.len() < 300, "{err}");
        assert!(check_default_image("a\nb").unwrap_err().contains("\\n"));
        // The same verdicts as spec.image.
        let ctx = ValidationContext::default();
        for image in [
            "repo/store:1",
            " repo/store:1 ",
            "repo/st ore:1",
            "docker.io/a",
            "Repo/x",
        ] {
            let mut value = tiered_value("DRAM", "1Gi");
            value["spec"]["image"] = json!(image);
            let spec_ok = validate_values(&value, None, &ctx).unwrap().is_empty();
            assert_eq!(check_default_image(image).is_ok(), spec_ok, "{image:?}");
        }
    }

    #[test]
    fn overlap_is_component_wise() {
        assert!(overlaps("/a/b", "/a/b"));
        assert!(overlaps("/a", "/a/b"));
        assert!(overlaps("/a/b/c", "/a/b"));
        assert!(!overlaps("/a/bc", "/a/b"));
        assert!(!overlaps("/dev/infiniband-cache", INFINIBAND_DIR));
        assert!(overlaps("/", "/x"));
        assert_eq!(clean("//a/./b/"), "/a/b");
    }

    #[test]
    fn addresses() {
        assert!(host_port_problem("store.example:50051").is_ok());
        assert!(host_port_problem("10.0.0.1:9003").is_ok());
        assert!(host_port_problem("[::1]:9003").is_ok());
        // What Go's SplitHostPort, Atoi and url.Parse take: leading zeros of a port, the
        // sub-delimiters and non-ASCII letters in a host.
        for good in [
            "store:08",
            "store:0009003",
            "a+b.example:1",
            "bücher.example:50051",
            "UPPER.example:1",
            "store_1:1",
            "[2001:db8::1]:9003",
        ] {
            assert!(host_port_problem(good).is_ok(), "{good:?} must be admitted");
        }
        for bad in [
            "store",
            ":9003",
            "store:",
            "store:0",
            "store:65536",
            "store:-1",
            "store:99999999999999999999",
            "[]:1",
            "[::1]x:1",
            "[::1]:1]",
            "a[b:1",
            "a b:1",
            "a%41:1",
            "a#b:1",
            "store:1\u{7f}",
            " store:1",
            "store:1 ",
            "user@store:1",
            "store/x:1",
            "http://store:1",
            "::1:9003",
            "[::1]",
            "[zz]:1",
            "store:1?x",
            "store:+1",
        ] {
            assert!(host_port_problem(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn entry_keys() {
        assert_eq!(entry_key("-enable_offload=false"), "enable_offload");
        assert_eq!(entry_key("--client_ttl=30"), "client_ttl");
        assert_eq!(entry_key("-flag"), "flag");
        assert_eq!(entry_key("-=x"), "");
        assert_eq!(entry_key("--"), "");
    }
}
