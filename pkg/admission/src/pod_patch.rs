//! The patch of a changed `Pod` without JSON trees of the whole pod.
//!
//! [`raw_patch`](crate::patch::raw_patch) builds `serde_json::Value` trees of the typed pod
//! before and after the change, diffs them against the object as sent (`rebase`), applies the
//! result to a copy of that object and reads it back. A handler such as the model-cache rewrite
//! changes a few members of a pod (labels, annotations, volumes, init containers, a container's
//! env and mounts). Here the typed pods are compared member by member (no allocation) and the
//! operations `rebase` would produce for those members are written directly:
//!
//! - every member of the pod but `metadata.labels`, `metadata.annotations`, `spec.volumes`,
//!   `spec.initContainers` and `spec.containers` must be equal (compared typed, each field
//!   named, so a field added to the types fails to compile here rather than go unpatched);
//! - labels and annotations (maps of strings, which hold nothing unmodelled): `replace` of a
//!   changed key, `add` of a new one, then `remove` of a dropped one, as `rebase` does for an
//!   object; a map the typed object lacked is added whole, one it drops removed;
//! - volumes, init containers, containers, and a changed container's `env` and
//!   `volumeMounts`: lists whose elements `rebase` identifies by a key (the first of its
//!   identity keys that every element carries, unique in the list before and after, and that
//!   the raw elements carry with the same values: `name`, and `mountPath` for mounts), changed
//!   without moving a kept element and with at most 64 removals and insertions: `rebase`
//!   removes the dropped elements (last first), adds the new ones at their final index, and
//!   patches the kept ones in place; here the same, each new element added whole;
//! - a kept element that changed is patched in place: a container whose fields but `env` and
//!   `volumeMounts` are equal by recursing into those two lists; any other element only when
//!   its raw value is exactly its typed value (nothing unmodelled, nothing defaulted), by
//!   `rebase` of that element alone.
//!
//! Anything else (`None` from [`patch`]) takes the general path, with its checks. That the two
//! make the same object of every pod the rewrite admits, as sent and with unmodelled fields
//! beside every member it changes, is tested on the fixtures of `pkg/modelvolume`
//! (`cmd/webhook/tests/patch.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::patch::{Patch, PatchOperation, PointerBuf, add, rebase, remove, replace};

/// Most removals and insertions one list change is made of here (`rebase` replaces a list
/// needing more than its `MAX_LIST_OPS` whole).
const MAX_LIST_OPS: usize = 64;

/// The JSON patch from `old` (the pod `raw` was read as) to `new`, shaped to apply to `raw`,
/// as [`raw_patch`](crate::patch::raw_patch) makes it; `None` when the change is not of the
/// kind described in the module's documentation.
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
        let mut at = PointerBuf::new();
        at.push_back("metadata");
        string_map(
            raw_meta,
            "labels",
            old_meta.labels.as_ref(),
            new_meta.labels.as_ref(),
            &at,
            &mut ops,
        )?;
        string_map(
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
        let mut at = PointerBuf::new();
        at.push_back("spec");
        let volumes = List::<Volume> {
            keys: &[("name", |v| &v.name)],
            in_place: element_in_place,
        };
        volumes.member(
            raw_spec,
            "volumes",
            old_spec.volumes.as_deref(),
            new_spec.volumes.as_deref(),
            &at,
            &mut ops,
        )?;
        let containers = List::<Container> {
            keys: &[("name", |c| &c.name)],
            in_place: container_in_place,
        };
        containers.member(
            raw_spec,
            "initContainers",
            old_spec.init_containers.as_deref(),
            new_spec.init_containers.as_deref(),
            &at,
            &mut ops,
        )?;
        containers.member(
            raw_spec,
            "containers",
            Some(&old_spec.containers),
            Some(&new_spec.containers),
            &at,
            &mut ops,
        )?;
    }
    Some(Patch(ops))
}

/// A map of strings at `key` of the raw object `raw` (at `at`), as `rebase` patches it.
fn string_map(
    raw: &Map<String, Value>,
    key: &str,
    old: Option<&BTreeMap<String, String>>,
    new: Option<&BTreeMap<String, String>>,
    at: &PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Option<()> {
    if old == new {
        return Some(());
    }
    let mut path = at.clone();
    path.push_back(key);
    match (old, new) {
        (None, None) => {}
        (Some(_), None) => {
            if raw.contains_key(key) {
                ops.push(remove(path));
            }
        }
        (None, Some(new)) => ops.push(add(path, serde_json::to_value(new).ok()?)),
        (Some(old), Some(new)) => {
            // The typed map was read from a raw object (a map of strings cannot hold `null`).
            let raw_map = raw.get(key)?.as_object()?;
            for (k, v) in new {
                let mut at_key = path.clone();
                at_key.push_back(k.as_str());
                match old.get(k) {
                    Some(before) if before == v => {}
                    Some(_) => ops.push(replace(at_key, Value::String(v.clone()))),
                    None => ops.push(add(at_key, Value::String(v.clone()))),
                }
            }
            for k in old.keys().filter(|k| !new.contains_key(*k)) {
                if raw_map.contains_key(k) {
                    let mut at_key = path.clone();
                    at_key.push_back(k.as_str());
                    ops.push(remove(at_key));
                }
            }
        }
    }
    Some(())
}

/// An identity key of list elements: its name, and the typed element's value there.
type IdentityKey<T> = (&'static str, fn(&T) -> &String);

/// How to patch a list of `T` as `rebase` does: the identity keys it would try (in its order),
/// each with the typed element's value there, and how a kept element that changed is patched.
struct List<T: 'static> {
    keys: &'static [IdentityKey<T>],
    in_place: fn(&Value, &T, &T, &PointerBuf, &mut Vec<PatchOperation>) -> Option<()>,
}

impl<T: Serialize + PartialEq> List<T> {
    /// The list at `key` of the raw object `raw` (at `at`); `None` for the typed object means
    /// the type leaves it out.
    fn member(
        &self,
        raw: &Map<String, Value>,
        key: &str,
        old: Option<&[T]>,
        new: Option<&[T]>,
        at: &PointerBuf,
        ops: &mut Vec<PatchOperation>,
    ) -> Option<()> {
        if old == new {
            return Some(());
        }
        let mut path = at.clone();
        path.push_back(key);
        match (old, new) {
            (None, None) => {}
            (Some(_), None) => {
                if raw.contains_key(key) {
                    ops.push(remove(path));
                }
            }
            (None, Some(new)) => ops.push(add(path, serde_json::to_value(new).ok()?)),
            (Some(old), Some(new)) => match raw.get(key) {
                // A typed value the raw object lacks (a required list defaulted on decoding).
                None | Some(Value::Null) => ops.push(add(path, serde_json::to_value(new).ok()?)),
                Some(Value::Array(raw)) => self.keyed(raw, old, new, &path, ops)?,
                Some(_) => return None,
            },
        }
        Some(())
    }

    /// The identities of `list` by `id`, if unique.
    fn identities(list: &[T], id: fn(&T) -> &String) -> Option<Vec<&str>> {
        let mut seen = HashSet::with_capacity(list.len());
        list.iter()
            .map(|e| {
                let key = id(e).as_str();
                seen.insert(key).then_some(key)
            })
            .collect()
    }

    /// The old and new identities by the first key that identifies the elements of `old`
    /// (carried by the raw elements with the same values) and of `new`, as `rebase` picks it.
    fn key<'a>(
        &self,
        raw: &[Value],
        old: &'a [T],
        new: &'a [T],
    ) -> Option<(Vec<&'a str>, Vec<&'a str>)> {
        self.keys.iter().find_map(|(name, id)| {
            let old_ids = Self::identities(old, *id)?;
            let raw_carries = raw.len() == old_ids.len()
                && raw
                    .iter()
                    .zip(&old_ids)
                    .all(|(r, id)| r.get(*name).and_then(Value::as_str) == Some(*id));
            raw_carries.then_some(())?;
            Some((old_ids, Self::identities(new, *id)?))
        })
    }

    /// A keyed list changed without moves: removals (last first), insertions at their final
    /// index, then the kept elements that changed, patched in place.
    fn keyed(
        &self,
        raw: &[Value],
        old: &[T],
        new: &[T],
        path: &PointerBuf,
        ops: &mut Vec<PatchOperation>,
    ) -> Option<()> {
        if raw.len() != old.len() {
            return None;
        }
        let (old_ids, new_ids) = self.key(raw, old, new)?;
        let index: HashMap<&str, usize> =
            old_ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let source: Vec<Option<usize>> = new_ids.iter().map(|id| index.get(id).copied()).collect();
        let kept: Vec<usize> = source.iter().flatten().copied().collect();
        if kept.windows(2).any(|w| w[0] > w[1]) {
            return None;
        }
        let removed = old.len() - kept.len();
        let added = new.len() - kept.len();
        if removed + added > MAX_LIST_OPS {
            return None;
        }
        let mut is_kept = vec![false; old.len()];
        for &i in &kept {
            is_kept[i] = true;
        }
        for i in (0..old.len()).rev().filter(|&i| !is_kept[i]) {
            let mut at = path.clone();
            at.push_back(i);
            ops.push(remove(at));
        }
        for (j, _) in source.iter().enumerate().filter(|(_, s)| s.is_none()) {
            let mut at = path.clone();
            at.push_back(j);
            ops.push(add(at, serde_json::to_value(&new[j]).ok()?));
        }
        for (j, i) in source
            .iter()
            .enumerate()
            .filter_map(|(j, s)| Some((j, (*s)?)))
        {
            if old[i] != new[j] {
                let mut at = path.clone();
                at.push_back(j);
                (self.in_place)(&raw[i], &old[i], &new[j], &at, ops)?;
            }
        }
        Some(())
    }
}

/// A kept element that changed, whose raw value is exactly its typed value: `rebase` of the
/// element alone (so nothing unmodelled or defaulted needs keeping).
fn element_in_place<T: Serialize>(
    raw: &Value,
    old: &T,
    new: &T,
    path: &PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Option<()> {
    let old_value = serde_json::to_value(old).ok()?;
    if *raw != old_value {
        return None;
    }
    let new_value = serde_json::to_value(new).ok()?;
    rebase(Some(raw), &old_value, &new_value, &mut path.clone(), ops).ok()
}

/// A kept container that changed: only its `env` and `volumeMounts`, by recursing into them;
/// otherwise as [`element_in_place`].
fn container_in_place(
    raw: &Value,
    old: &Container,
    new: &Container,
    path: &PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Option<()> {
    if !same_container_but_env_and_mounts(old, new) {
        return element_in_place(raw, old, new, path, ops);
    }
    let raw = raw.as_object()?;
    let env = List::<EnvVar> {
        keys: &[("name", |e| &e.name)],
        in_place: element_in_place,
    };
    env.member(
        raw,
        "env",
        old.env.as_deref(),
        new.env.as_deref(),
        path,
        ops,
    )?;
    let mounts = List::<VolumeMount> {
        keys: &[("name", |m| &m.name), ("mountPath", |m| &m.mount_path)],
        in_place: element_in_place,
    };
    mounts.member(
        raw,
        "volumeMounts",
        old.volume_mounts.as_deref(),
        new.volume_mounts.as_deref(),
        path,
        ops,
    )
}

/// Whether `a` and `b` are equal but for `env` and `volumeMounts`. Every field is named, so a
/// field added to `Container` fails to compile here rather than go unpatched.
fn same_container_but_env_and_mounts(a: &Container, b: &Container) -> bool {
    let Container {
        env: _,
        volume_mounts: _,
        args,
        command,
        env_from,
        image,
        image_pull_policy,
        lifecycle,
        liveness_probe,
        name,
        ports,
        readiness_probe,
        resize_policy,
        resources,
        restart_policy,
        restart_policy_rules,
        security_context,
        startup_probe,
        stdin,
        stdin_once,
        termination_message_path,
        termination_message_policy,
        tty,
        volume_devices,
        working_dir,
    } = a;
    *args == b.args
        && *command == b.command
        && *env_from == b.env_from
        && *image == b.image
        && *image_pull_policy == b.image_pull_policy
        && *lifecycle == b.lifecycle
        && *liveness_probe == b.liveness_probe
        && *name == b.name
        && *ports == b.ports
        && *readiness_probe == b.readiness_probe
        && *resize_policy == b.resize_policy
        && *resources == b.resources
        && *restart_policy == b.restart_policy
        && *restart_policy_rules == b.restart_policy_rules
        && *security_context == b.security_context
        && *startup_probe == b.startup_probe
        && *stdin == b.stdin
        && *stdin_once == b.stdin_once
        && *termination_message_path == b.termination_message_path
        && *termination_message_policy == b.termination_message_policy
        && *tty == b.tty
        && *volume_devices == b.volume_devices
        && *working_dir == b.working_dir
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
