//! The patch of a changed `Pod` without JSON trees of the whole pod.
//!
//! [`raw_patch`](crate::patch::raw_patch) builds `serde_json::Value` trees of the typed pod
//! before and after the change, diffs them against the object as sent, applies the result to a
//! copy of that object and reads it back. For a pod, a handler such as the model-cache rewrite
//! changes a few members (labels, annotations, volumes, init containers, a container's env and
//! mounts) of an object of many. Here the typed pods are compared member by member (no
//! allocation), and the same algorithm, with the same checks, runs on each changed member
//! alone:
//!
//! - `metadata.labels`, `metadata.annotations`, `spec.volumes`, `spec.initContainers` and
//!   `spec.containers` are patched where they changed; every other member of the pod must be
//!   equal (compared typed, each field named, so a field added to the types is not missed),
//!   else the general path runs;
//! - a changed member is diffed by the same `rebase` as the whole pod would be, the operations
//!   applied to a copy of the raw member, which must read back as the handler's member, and
//!   keep the raw member's unmodelled fields (`keeps_residue`);
//! - `spec.containers` (and `spec.initContainers`) whose elements keep their names, in order,
//!   unique and carried by the raw elements, are a keyed list whose kept elements the general
//!   path patches in place one by one; so here only the changed elements are diffed.
//!
//! The general path diffs object members independently and a keyed list whose identities did
//! not change element by element, so the operations are those it would produce for these
//! members. Anything else (`None` from [`patch`]) takes the general path.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::patch::{
    Patch, PatchOperation, PointerBuf, add, decode_at_path, keeps_residue, rebase, remove,
};

/// The JSON patch from `old` (the pod `raw` was read as) to `new`, shaped to apply to `raw`,
/// as [`raw_patch`](crate::patch::raw_patch) would make it; `None` when the change touches
/// anything else than the members named in the module's documentation, or any check fails
/// (the caller then takes the general path, which reports why).
pub(crate) fn patch(raw: &Value, old: &Pod, new: &Pod) -> Option<Patch> {
    let Pod {
        metadata: old_meta,
        spec: old_spec,
        status: old_status,
    } = old;
    let Pod {
        metadata: new_meta,
        spec: new_spec,
        status: new_status,
    } = new;
    if old_status != new_status {
        return None;
    }
    let raw = raw.as_object()?;
    let mut ops = Vec::new();
    if old_meta != new_meta {
        if !same_meta_but_maps(old_meta, new_meta) {
            return None;
        }
        let raw_meta = raw.get("metadata")?.as_object()?;
        let at = pointer(&["metadata"]);
        member(
            raw_meta,
            "labels",
            old_meta.labels.as_ref(),
            new_meta.labels.as_ref(),
            &at,
            &mut ops,
        )?;
        member(
            raw_meta,
            "annotations",
            old_meta.annotations.as_ref(),
            new_meta.annotations.as_ref(),
            &at,
            &mut ops,
        )?;
    }
    if old_spec != new_spec {
        let (Some(old_spec), Some(new_spec)) = (old_spec, new_spec) else {
            return None;
        };
        if !same_spec_but_lists(old_spec, new_spec) {
            return None;
        }
        let raw_spec = raw.get("spec")?.as_object()?;
        let at = pointer(&["spec"]);
        member(
            raw_spec,
            "volumes",
            old_spec.volumes.as_ref(),
            new_spec.volumes.as_ref(),
            &at,
            &mut ops,
        )?;
        match (&old_spec.init_containers, &new_spec.init_containers) {
            (Some(old_inits), Some(new_inits)) if old_inits != new_inits => {
                containers(
                    raw_spec,
                    "initContainers",
                    old_inits,
                    new_inits,
                    &at,
                    &mut ops,
                )?;
            }
            (old_inits, new_inits) => member(
                raw_spec,
                "initContainers",
                old_inits.as_ref(),
                new_inits.as_ref(),
                &at,
                &mut ops,
            )?,
        }
        if old_spec.containers != new_spec.containers {
            containers(
                raw_spec,
                "containers",
                &old_spec.containers,
                &new_spec.containers,
                &at,
                &mut ops,
            )?;
        }
    }
    Some(Patch(ops))
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    let mut path = PointerBuf::new();
    for token in tokens {
        path.push_back(*token);
    }
    path
}

/// The operations for the member `key` of the raw object `raw` (at `at`), typed `old` before
/// and `new` after (`None`: the type leaves it out), as the general path's object diff makes
/// them: removed when the handler dropped it, added whole when the typed object had none,
/// else diffed and checked as [`subtree`].
fn member<T>(
    raw: &Map<String, Value>,
    key: &str,
    old: Option<&T>,
    new: Option<&T>,
    at: &PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Option<()>
where
    T: Serialize + DeserializeOwned + PartialEq,
{
    if old == new {
        return Some(());
    }
    let mut path = at.clone();
    path.push_back(key);
    match (old, new) {
        (None, None) => Some(()),
        (Some(_), None) => {
            if raw.contains_key(key) {
                ops.push(remove(path));
            }
            Some(())
        }
        (old, Some(new)) => subtree(raw.get(key), old, new, path, ops),
    }
}

/// The operations turning the raw value `raw` (typed `old`; `None` when the typed object had
/// nothing there) into `new`, at `path`: the general path's diff of this value alone, applied
/// to a copy of `raw`, which must read back as `new` and keep the fields `raw` holds that the
/// type does not model. `None` when a check fails.
fn subtree<T>(
    raw: Option<&Value>,
    old: Option<&T>,
    new: &T,
    path: PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Option<()>
where
    T: Serialize + DeserializeOwned,
{
    let new_value = serde_json::to_value(new).ok()?;
    let mut relative = Vec::new();
    let old_value = match old {
        Some(old) => {
            let old_value = serde_json::to_value(old).ok()?;
            rebase(
                raw,
                &old_value,
                &new_value,
                &mut PointerBuf::new(),
                &mut relative,
            )
            .ok()?;
            Some(old_value)
        }
        // Absent from the typed object: added whole (replacing a raw `null`).
        None => {
            relative.push(add(PointerBuf::new(), new_value.clone()));
            None
        }
    };
    if relative.is_empty() {
        return Some(());
    }
    let patch = Patch(relative);
    let mut patched = raw.cloned().unwrap_or(Value::Null);
    json_patch::patch(&mut patched, &patch).ok()?;
    let reread: T = decode_at_path(&patched).ok()?;
    if serde_json::to_vec(&reread).ok()? != serde_json::to_vec(new).ok()?
        && serde_json::to_value(&reread).ok()? != new_value
    {
        return None;
    }
    match &old_value {
        Some(old_value) => keeps_residue(
            raw,
            old_value,
            Some(&patched),
            &new_value,
            &mut PointerBuf::new(),
        )
        .ok()?,
        // Nothing typed there before: nothing unmodelled may be there now.
        None => keeps_residue(
            None,
            &Value::Null,
            Some(&patched),
            &new_value,
            &mut PointerBuf::new(),
        )
        .ok()?,
    }
    ops.extend(patch.0.into_iter().map(|op| prefixed(op, &path)));
    Some(())
}

/// A list of containers at `key` of the raw spec: element by element when the general path
/// would patch it so (the same names in the same order, unique, and the raw elements carrying
/// them: a keyed list without removals, moves or insertions), else as a whole [`member`].
fn containers(
    raw_spec: &Map<String, Value>,
    key: &str,
    old: &[Container],
    new: &[Container],
    at: &PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Option<()> {
    let raw = raw_spec.get(key).and_then(Value::as_array);
    let in_place = raw.filter(|raw| {
        let mut names = HashSet::with_capacity(old.len());
        raw.len() == old.len()
            && old.len() == new.len()
            && old.iter().zip(new).zip(raw.iter()).all(|((o, n), r)| {
                o.name == n.name
                    && r.get("name").and_then(Value::as_str) == Some(o.name.as_str())
                    && names.insert(o.name.as_str())
            })
    });
    let Some(raw) = in_place else {
        return member(
            raw_spec,
            key,
            Some(&old.to_vec()),
            Some(&new.to_vec()),
            at,
            ops,
        );
    };
    let mut path = at.clone();
    path.push_back(key);
    for (i, ((o, n), r)) in old.iter().zip(new).zip(raw).enumerate() {
        if o != n {
            let mut element = path.clone();
            element.push_back(i);
            subtree(Some(r), Some(o), n, element, ops)?;
        }
    }
    Some(())
}

/// `op` with `prefix` before its paths.
fn prefixed(op: PatchOperation, prefix: &PointerBuf) -> PatchOperation {
    let at = |path: &PointerBuf| prefix.concat(path);
    match op {
        PatchOperation::Add(mut o) => {
            o.path = at(&o.path);
            PatchOperation::Add(o)
        }
        PatchOperation::Remove(mut o) => {
            o.path = at(&o.path);
            PatchOperation::Remove(o)
        }
        PatchOperation::Replace(mut o) => {
            o.path = at(&o.path);
            PatchOperation::Replace(o)
        }
        PatchOperation::Move(mut o) => {
            o.path = at(&o.path);
            o.from = at(&o.from);
            PatchOperation::Move(o)
        }
        PatchOperation::Copy(mut o) => {
            o.path = at(&o.path);
            o.from = at(&o.from);
            PatchOperation::Copy(o)
        }
        PatchOperation::Test(mut o) => {
            o.path = at(&o.path);
            PatchOperation::Test(o)
        }
    }
}

/// Whether `a` and `b` are equal but for labels and annotations. Every field is named, so a
/// field added to `ObjectMeta` fails to compile here rather than go unpatched.
fn same_meta_but_maps(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    let ObjectMeta {
        annotations: _,
        labels: _,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        managed_fields,
        name,
        namespace,
        owner_references,
        resource_version,
        self_link,
        uid,
    } = a;
    *creation_timestamp == b.creation_timestamp
        && *deletion_grace_period_seconds == b.deletion_grace_period_seconds
        && *deletion_timestamp == b.deletion_timestamp
        && *finalizers == b.finalizers
        && *generate_name == b.generate_name
        && *generation == b.generation
        && *managed_fields == b.managed_fields
        && *name == b.name
        && *namespace == b.namespace
        && *owner_references == b.owner_references
        && *resource_version == b.resource_version
        && *self_link == b.self_link
        && *uid == b.uid
}

/// Whether `a` and `b` are equal but for volumes, init containers and containers. Every field
/// is named, so a field added to `PodSpec` fails to compile here rather than go unpatched.
fn same_spec_but_lists(a: &PodSpec, b: &PodSpec) -> bool {
    let PodSpec {
        volumes: _,
        init_containers: _,
        containers: _,
        active_deadline_seconds,
        affinity,
        automount_service_account_token,
        dns_config,
        dns_policy,
        enable_service_links,
        ephemeral_containers,
        eviction_responders,
        host_aliases,
        host_ipc,
        host_network,
        host_pid,
        host_users,
        hostname,
        hostname_override,
        image_pull_secrets,
        node_name,
        node_selector,
        os,
        overhead,
        preemption_policy,
        priority,
        priority_class_name,
        readiness_gates,
        resource_claims,
        resources,
        restart_policy,
        runtime_class_name,
        scheduler_name,
        scheduling_gates,
        scheduling_group,
        security_context,
        service_account,
        service_account_name,
        set_hostname_as_fqdn,
        share_process_namespace,
        subdomain,
        termination_grace_period_seconds,
        tolerations,
        topology_spread_constraints,
    } = a;
    *active_deadline_seconds == b.active_deadline_seconds
        && *affinity == b.affinity
        && *automount_service_account_token == b.automount_service_account_token
        && *dns_config == b.dns_config
        && *dns_policy == b.dns_policy
        && *enable_service_links == b.enable_service_links
        && *ephemeral_containers == b.ephemeral_containers
        && *eviction_responders == b.eviction_responders
        && *host_aliases == b.host_aliases
        && *host_ipc == b.host_ipc
        && *host_network == b.host_network
        && *host_pid == b.host_pid
        && *host_users == b.host_users
        && *hostname == b.hostname
        && *hostname_override == b.hostname_override
        && *image_pull_secrets == b.image_pull_secrets
        && *node_name == b.node_name
        && *node_selector == b.node_selector
        && *os == b.os
        && *overhead == b.overhead
        && *preemption_policy == b.preemption_policy
        && *priority == b.priority
        && *priority_class_name == b.priority_class_name
        && *readiness_gates == b.readiness_gates
        && *resource_claims == b.resource_claims
        && *resources == b.resources
        && *restart_policy == b.restart_policy
        && *runtime_class_name == b.runtime_class_name
        && *scheduler_name == b.scheduler_name
        && *scheduling_gates == b.scheduling_gates
        && *scheduling_group == b.scheduling_group
        && *security_context == b.security_context
        && *service_account == b.service_account
        && *service_account_name == b.service_account_name
        && *set_hostname_as_fqdn == b.set_hostname_as_fqdn
        && *share_process_namespace == b.share_process_namespace
        && *subdomain == b.subdomain
        && *termination_grace_period_seconds == b.termination_grace_period_seconds
        && *tolerations == b.tolerations
        && *topology_spread_constraints == b.topology_spread_constraints
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The rewrite's kind of change takes this path (not the general one), and its patch makes
    /// of the object as sent what the general path makes, unmodelled fields included.
    #[test]
    fn a_rewrite_like_change_is_patched_member_by_member_as_the_general_path_would() {
        let raw = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "p-", "labels": {"app": "a"}, "futureMeta": 1},
            "spec": {
                "containers": [
                    {"name": "main", "image": "i", "env": [{"name": "A", "value": "1"}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data", "futureMount": 1}],
                     "futureContainer": "kept"},
                    {"name": "side", "image": "s", "futureContainer": "kept"}
                ],
                "initContainers": [{"name": "fetch", "image": "f"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "futureSpec": true
            }
        });
        let old: Pod = serde_json::from_value(raw.clone()).unwrap();
        let mut new = old.clone();
        new.metadata
            .annotations
            .get_or_insert_default()
            .insert("x/y".into(), "z".into());
        new.metadata
            .labels
            .get_or_insert_default()
            .insert("model".into(), "m".into());
        let spec = new.spec.as_mut().unwrap();
        spec.volumes.get_or_insert_default().push(
            serde_json::from_value(json!({"name": "model", "persistentVolumeClaim": {"claimName": "c", "readOnly": true}})).unwrap(),
        );
        spec.init_containers.as_mut().unwrap()[0] =
            serde_json::from_value(json!({"name": "wait", "image": "w"})).unwrap();
        let main = &mut spec.containers[0];
        main.env
            .get_or_insert_default()
            .push(serde_json::from_value(json!({"name": "HF_HUB_OFFLINE", "value": "1"})).unwrap());
        main.volume_mounts.get_or_insert_default().push(
            serde_json::from_value(json!({"name": "model", "mountPath": "/m", "readOnly": true}))
                .unwrap(),
        );
        let fast = patch(&raw, &old, &new).expect("taken member by member");
        let general = crate::patch::raw_patch(&raw, &new).unwrap();
        let patched = crate::patch::apply(&raw, &fast).unwrap();
        assert_eq!(patched, crate::patch::apply(&raw, &general).unwrap());
        assert_eq!(patched["spec"]["containers"][0]["futureContainer"], "kept");
        assert_eq!(
            patched["spec"]["containers"][0]["volumeMounts"][0]["futureMount"],
            1
        );
        assert_eq!(serde_json::from_value::<Pod>(patched).unwrap(), new);
        // Nothing of the unchanged container or of other members is in the patch.
        let text = serde_json::to_string(&fast).unwrap();
        assert!(!text.contains("/spec/containers/1"), "{text}");
        assert!(!text.contains("generateName"), "{text}");

        // A change elsewhere (here the node selector) takes the general path.
        let mut other = new.clone();
        other.spec.as_mut().unwrap().node_selector = Some([("a".into(), "b".into())].into());
        assert!(patch(&raw, &old, &other).is_none());
    }
}
