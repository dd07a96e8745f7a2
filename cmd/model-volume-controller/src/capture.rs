//! Capture after Ready: the IO of [`warmcache_modelvolume::capture`]. One reconcile per capture
//! source of this node = fetch (the caches, the pod's Namespace and, when the claim's election
//! names another pod, that pod, read afresh) -> the pure step
//! [`warmcache_modelvolume::capture::capture_step`] -> its IO: measure the landing (reached
//! without following a link) and create the primary claim sized from it (roxReadOnly), or elect
//! the binding controller's claim with a preconditioned patch (rwxReadOnly); create the mount
//! holder; copy through the holder's volume; record the copy; give up after three failed copies.
//! All of it inside a `capture_copy` span continuing the pod's trace (field `kind`: `model` or
//! `cache_set`).
//!
//! A pod can be two capture sources at once ([`warmcache_modelvolume::capture::capture_sources`]:
//! its model's and its compile-cache set's, two bindings): each is reconciled on its own, one's
//! failure or refusal never holding back the other. A compile-cache set
//! ([`CaptureKind::CacheSet`]) is measured and copied through the selection
//! [`warmcache_modelvolume::cacheset::travels`] (`measure_dir_selected`,
//! `copy_dir_into_mount_selected`): only its compile-cache directories, never a credential.
//!
//! API calls beyond the staging copy's ([`crate::agent`]): `get namespaces` (the pod's
//! namespace, whose labels decide its sharing domain), and `patch persistentvolumeclaims` in the
//! control namespace for the rwxReadOnly election and its undoing (merge patches carrying the
//! claim's resourceVersion) and the give-up's `copy-failed` annotation.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tracing::Instrument;
use warmcache_modelvolume::agent::{
    COMPONENT_LABEL, COPY_POD_ANNOTATION, COPY_POD_NAME_ANNOTATION, Doomed, MOUNT_HOLDER,
    holder_name,
};
use warmcache_modelvolume::capture::{
    CaptureKind, CaptureObserved, CaptureSource, CaptureState, CaptureStep, ELECTION_KEYS,
    capture_election_annotations, capture_primary_claim, capture_step, check_source,
    elected_pod_gone,
};
use warmcache_modelvolume::lifecycle::copied_bytes;
use warmcache_modelvolume::volume_keys::{COPY_FAILED_ANNOTATION, SOURCE_NAMESPACE_LABEL};
use warmcache_runtime::{Action, ObjectRef};

use crate::agent::{
    Agent, CopySource, FIELD_MANAGER, Failure, REQUEUE_AFTER_FAILED_COPY, REQUEUE_WAITING,
    api_error, empty_dir_path,
};

/// Look again this often at a capture pod refused for something that may change (its landing
/// not there yet).
pub const REQUEUE_CAPTURE_RETRY: Duration = Duration::from_secs(30);

/// The Events a capture writes on its pod, by kind: (captured, refused, failed, action).
pub(crate) const fn event_words(
    kind: CaptureKind,
) -> (&'static str, &'static str, &'static str, &'static str) {
    match kind {
        CaptureKind::Model => (
            "ModelCaptured",
            "ModelCaptureRefused",
            "ModelCaptureFailed",
            "CaptureModel",
        ),
        CaptureKind::CacheSet => (
            "CacheSetCaptured",
            "CacheSetCaptureRefused",
            "CacheSetCaptureFailed",
            "CaptureCacheSet",
        ),
    }
}

/// The delays the agent requeues with, shortest first ([`sooner`] compares against them).
const DELAYS: [Duration; 4] = [
    Duration::from_secs(1),
    REQUEUE_WAITING,
    REQUEUE_AFTER_FAILED_COPY,
    REQUEUE_CAPTURE_RETRY,
];

/// The sooner of two next looks at one pod: a requeue before waiting for a change, the shorter
/// of two requeues. `Action` does not tell its delay, so requeues are compared against the
/// agent's own [`DELAYS`]; two unknown ones give the shortest of them.
pub(crate) fn sooner(a: Action, b: Action) -> Action {
    if a == Action::await_change() || a == b {
        return b;
    }
    if b == Action::await_change() {
        return a;
    }
    DELAYS
        .into_iter()
        .map(Action::requeue)
        .find(|d| *d == a || *d == b)
        .unwrap_or(Action::requeue(DELAYS[0]))
}

impl Agent {
    /// Reconciles every capture a pod is labelled for (`states`, from
    /// [`warmcache_modelvolume::capture::capture_sources`]): each on its own, all of them even
    /// when one fails (the first failure is returned, the runtime retries the pod); the sooner
    /// of their next looks.
    pub(crate) async fn captures(
        &self,
        pod: &Pod,
        states: Vec<(CaptureKind, CaptureState)>,
    ) -> Result<Action, Failure> {
        let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
            == Some(self.settings.node.as_str());
        let mut next = Action::await_change();
        let mut failed = None;
        for (kind, state) in states {
            let result = match state {
                CaptureState::Source(source) => self.capture(pod, source).await,
                CaptureState::Refused(why) => {
                    if on_node {
                        self.refuse(pod, kind, &why).await;
                    }
                    Ok(Action::await_change())
                }
                CaptureState::NotCapture => Ok(Action::await_change()),
            };
            match result {
                Ok(action) => next = sooner(next, action),
                Err(e) => {
                    tracing::warn!(pod = %pod.name_any(), namespace = %pod.namespace().unwrap_or_default(), kind = kind.label(), error = %e, "the capture failed; retrying");
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(next),
        }
    }

    /// Reconciles the capture source `source` (read from `pod`).
    pub(crate) async fn capture(
        &self,
        pod: &Pod,
        source: CaptureSource,
    ) -> Result<Action, Failure> {
        if source.node.as_deref() != Some(self.settings.node.as_str()) {
            return Ok(Action::await_change());
        }
        let span = tracing::info_span!("capture_copy", pod = %source.name, namespace = %source.namespace, binding = %source.binding, kind = source.kind.label());
        if let Err(err) = warmcache_telemetry::set_parent_from_annotations(&span, pod.annotations())
        {
            tracing::debug!(error = %err, "the capture span starts its own trace");
        }
        let traceparent = pod
            .annotations()
            .get(warmcache_telemetry::TRACE_PARENT_ANNOTATION)
            .cloned();
        self.capture_in_span(pod, &source, traceparent.as_ref())
            .instrument(span)
            .await
    }

    async fn capture_in_span(
        &self,
        pod: &Pod,
        source: &CaptureSource,
        traceparent: Option<&String>,
    ) -> Result<Action, Failure> {
        let binding = self
            .bindings
            .store()
            .get(&ObjectRef::new(&source.binding).within(&self.settings.control_namespace));
        // The namespace's labels, read afresh: they decide its sharing domain (an
        // administrator's, unlike the pod's own records).
        let namespace = match binding {
            Some(_) => Api::<Namespace>::all(self.client.clone())
                .get_opt(&source.namespace)
                .await
                .map_err(|e| api_error("get", "namespaces", &source.namespace, e))?,
            None => None,
        };
        let labels = namespace.map(|n| n.metadata.labels.unwrap_or_default());
        let claim = binding.as_deref().and_then(|b| self.claim(b));
        let holder = binding.as_deref().and_then(|b| self.holder(b));
        // Another pod's election is looked at (a read of that pod) only for a pod the binding
        // accepts: a refused one causes no further reads.
        let accepted = match (binding.as_deref(), labels.as_ref()) {
            (Some(b), Some(l)) => check_source(b, source, l).is_ok(),
            _ => false,
        };
        let claim_pod_gone = match claim.as_deref() {
            Some(c) if accepted && copied_bytes(c).is_none() => {
                self.elected_gone(c, source).await?
            }
            _ => false,
        };
        let step = capture_step(&CaptureObserved {
            node: &self.settings.node,
            source,
            namespace_labels: labels.as_ref(),
            binding: binding.as_deref(),
            claim: claim.as_deref(),
            holder: holder.as_deref(),
            holder_image: &self.settings.holder_image,
            claim_pod_gone,
            now: k8s_openapi::jiff::Timestamp::now(),
        });
        self.metrics.capture_step(source.kind, &step);
        let (captured_reason, _, failed_reason, action) = event_words(source.kind);
        match step {
            CaptureStep::Skip(why) => {
                tracing::debug!(%why, "nothing to capture now");
                Ok(Action::await_change())
            }
            CaptureStep::Wait(why) => {
                tracing::debug!(%why, "waiting");
                Ok(Action::requeue(REQUEUE_WAITING))
            }
            CaptureStep::Refused(why) => {
                self.refuse(pod, source.kind, &why).await;
                Ok(Action::await_change())
            }
            CaptureStep::CreateClaim => match binding.as_deref() {
                Some(b) => self.create_capture_claim(pod, b, source, traceparent).await,
                None => Ok(Action::await_change()),
            },
            CaptureStep::Elect {
                claim,
                resource_version,
            } => {
                let mut annotations: BTreeMap<String, Value> =
                    capture_election_annotations(source, &self.settings.node)
                        .into_iter()
                        .map(|(k, v)| (k, Value::String(v)))
                        .collect();
                if let Some(tp) = traceparent {
                    annotations.insert(
                        warmcache_telemetry::TRACE_PARENT_ANNOTATION.to_owned(),
                        Value::String(tp.clone()),
                    );
                }
                if self
                    .patch_claim(&claim, &resource_version, annotations)
                    .await?
                {
                    tracing::info!(%claim, "elected to capture into the primary claim");
                }
                Ok(Action::requeue(Duration::from_secs(1)))
            }
            CaptureStep::Reelect {
                claim,
                resource_version,
                drop_claim,
            } => {
                // The binding's holder of the gone pod's election (on its node, outside this
                // node's cache) goes first: a new one is placed on this node under its name.
                if let Some(b) = binding.as_deref() {
                    self.delete_binding_holder(&holder_name(b)).await?;
                }
                if drop_claim {
                    self.delete_claim(&claim).await?;
                } else {
                    let undone: BTreeMap<String, Value> = ELECTION_KEYS
                        .into_iter()
                        .map(|k| (k.to_owned(), Value::Null))
                        .collect();
                    self.patch_claim(&claim.name, &resource_version, undone)
                        .await?;
                }
                tracing::info!(claim = %claim.name, "undid the election of a capture pod that is gone before its copy; electing again");
                Ok(Action::requeue(Duration::from_secs(1)))
            }
            CaptureStep::CreateHolder(h) => {
                match self.pods_api().create(&PostParams::default(), &h).await {
                    Ok(_) => tracing::info!(holder = %h.name_any(), "created the mount holder"),
                    Err(e) if warmcache_kube::is_already_exists(&e) => {}
                    Err(e) => return Err(api_error("create", "pods", &h.name_any(), e)),
                }
                Ok(Action::requeue(REQUEUE_WAITING))
            }
            CaptureStep::DeleteHolder(d) => {
                self.delete_pod(&d).await?;
                Ok(Action::requeue(REQUEUE_WAITING))
            }
            CaptureStep::Copy { holder_uid, pv } => {
                // The cache may lag the copy's record: read the claim afresh, and never copy
                // again into one that records a copy.
                let Some(name) = claim.as_deref().map(ResourceExt::name_any) else {
                    return Ok(Action::requeue(REQUEUE_WAITING));
                };
                let fresh = self
                    .claims_api()
                    .get_opt(&name)
                    .await
                    .map_err(|e| api_error("get", "persistentvolumeclaims", &name, e))?;
                let Some(fresh) = fresh.filter(|c| copied_bytes(c).is_none()) else {
                    return Ok(Action::requeue(Duration::from_secs(1)));
                };
                let from = CopySource::Captured {
                    root: self.capture_root(source),
                    path: source.path.clone(),
                    kind: source.kind,
                };
                let action = self
                    .copy_into(&source.uid, from, &fresh, &holder_uid, &pv)
                    .await?;
                Ok(action)
            }
            CaptureStep::Done { holder, why } => {
                // The holder of this node's copy goes once it is recorded: said once, on the
                // pod the copy was taken from (whichever source of the binding found the holder
                // first: another capture source of the binding on this node may).
                let recorded = claim.as_deref().filter(|c| copied_bytes(c).is_some());
                let had_holder = holder.is_some();
                if let Some(d) = holder {
                    self.delete_pod(&d).await?;
                    tracing::info!(%why, "deleted the mount holder");
                }
                if let Some(c) = recorded.filter(|_| had_holder) {
                    let later = match source.kind {
                        CaptureKind::Model => "later pods read the shared copy",
                        CaptureKind::CacheSet => {
                            "later pods of the configuration are seeded from the set"
                        }
                    };
                    self.host
                        .recorder
                        .publish(
                            &elected_pod_ref(c, pod),
                            warmcache_kube::EventType::Normal,
                            captured_reason,
                            action,
                            Some(&format!("{why}; {later}")),
                        )
                        .await;
                } else {
                    tracing::debug!(%why, "nothing left to capture");
                }
                Ok(Action::await_change())
            }
            CaptureStep::GiveUp { holder, words } => {
                if let Some(d) = holder {
                    self.delete_pod(&d).await?;
                }
                if let Some(c) = claim.as_deref() {
                    let failed = BTreeMap::from([(
                        COPY_FAILED_ANNOTATION.to_owned(),
                        Value::String(words.clone()),
                    )]);
                    let rv = c.resource_version().unwrap_or_default();
                    if !self.patch_claim(&c.name_any(), &rv, failed).await? {
                        return Ok(Action::requeue(Duration::from_secs(1)));
                    }
                }
                self.metrics.capture_gave_up(source.kind);
                tracing::warn!(%words, "gave up capturing the pod's {}", match source.kind {
                    CaptureKind::Model => "download",
                    CaptureKind::CacheSet => "compile caches",
                });
                self.host
                    .recorder
                    .warning(pod, failed_reason, action, Some(&words))
                    .await;
                Ok(Action::await_change())
            }
        }
    }

    /// The pod's emptyDir on this node (the landing lies beneath it).
    fn capture_root(&self, source: &CaptureSource) -> std::path::PathBuf {
        empty_dir_path(&self.settings.kubelet_root, &source.uid, &source.volume)
    }

    /// Logs, counts and reports (a Warning Event on the pod, folded when repeated) a capture pod
    /// that is never copied.
    pub(crate) async fn refuse(&self, pod: &Pod, kind: CaptureKind, why: &str) {
        self.metrics.capture_refused(kind);
        tracing::warn!(pod = %pod.name_any(), namespace = %pod.namespace().unwrap_or_default(), kind = kind.label(), %why, "not capturing");
        let (_, refused, _, action) = event_words(kind);
        self.host
            .recorder
            .warning(pod, refused, action, Some(why))
            .await;
    }

    /// Whether the pod the claim's election names (not `source`) is gone, read afresh.
    async fn elected_gone(
        &self,
        claim: &PersistentVolumeClaim,
        source: &CaptureSource,
    ) -> Result<bool, Failure> {
        let a = claim.annotations();
        let (Some(uid), Some(name), Some(namespace)) = (
            a.get(COPY_POD_ANNOTATION),
            a.get(COPY_POD_NAME_ANNOTATION),
            a.get(SOURCE_NAMESPACE_LABEL),
        ) else {
            return Ok(false);
        };
        if *uid == source.uid {
            return Ok(false);
        }
        let pod = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| api_error("get", "pods", name, e))?;
        Ok(elected_pod_gone(uid, pod.as_ref()))
    }

    /// roxReadOnly election: measures the landing (reached without following a link; a
    /// compile-cache set only what travels) and creates the primary claim sized from it;
    /// AlreadyExists: another agent won.
    async fn create_capture_claim(
        &self,
        pod: &Pod,
        b: &warmcache_api_modelcache::v2beta1::ModelCacheBinding,
        source: &CaptureSource,
        traceparent: Option<&String>,
    ) -> Result<Action, Failure> {
        let (root, path) = (self.capture_root(source), source.path.clone());
        let shown = root.join(&path).display().to_string();
        let selected = source.kind.filtered();
        let measured = tokio::task::spawn_blocking(move || {
            warmcache_nodefs::open_dir_beneath(&root, &path).and_then(|tree| {
                if selected {
                    warmcache_nodefs::measure_dir_selected(
                        &tree,
                        &warmcache_modelvolume::cacheset::travels,
                    )
                } else {
                    warmcache_nodefs::measure_dir(&tree)
                }
            })
        })
        .await
        .map_err(|_| Failure::Task("measure"))?;
        let bytes = match measured {
            Ok(bytes) => bytes,
            Err(
                e @ (warmcache_nodefs::Error::Refused { .. }
                | warmcache_nodefs::Error::CrossesMount { .. }),
            ) => {
                // The pod's tree leads elsewhere (a link, another mount): never copied.
                self.refuse(
                    pod,
                    source.kind,
                    &format!("its landing {shown} is refused: {e}"),
                )
                .await;
                return Ok(Action::requeue(REQUEUE_CAPTURE_RETRY));
            }
            Err(e) => {
                return Err(Failure::Node {
                    what: format!("measuring the capture landing {shown}"),
                    source: e,
                });
            }
        };
        let claim = capture_primary_claim(
            b,
            source,
            &self.settings.node,
            bytes,
            self.settings.min_bytes,
        );
        self.create_elected_claim(claim, traceparent, bytes, "captured")
            .await
    }

    /// Merges `annotations` (a null removes one) into the claim `name`, only if it is still at
    /// `resource_version`. `false` on a conflict (someone else changed it: re-read).
    async fn patch_claim(
        &self,
        name: &str,
        resource_version: &str,
        annotations: BTreeMap<String, Value>,
    ) -> Result<bool, Failure> {
        let patch = json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": annotations,
            }
        });
        match self
            .claims_api()
            .patch(
                name,
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if warmcache_kube::is_conflict(&e) => {
                tracing::debug!(claim = %name, "the claim changed meanwhile; reading it again");
                Ok(false)
            }
            Err(e) => Err(api_error("patch", "persistentvolumeclaims", name, e)),
        }
    }

    /// Deletes the binding's mount holder `name` wherever it runs (read afresh; only a mount
    /// holder, with its UID as precondition).
    async fn delete_binding_holder(&self, name: &str) -> Result<(), Failure> {
        let holder = self
            .pods_api()
            .get_opt(name)
            .await
            .map_err(|e| api_error("get", "pods", name, e))?;
        if let Some(d) = holder
            .filter(|h| h.labels().get(COMPONENT_LABEL).map(String::as_str) == Some(MOUNT_HOLDER))
            .and_then(|h| {
                Some(Doomed {
                    name: h.metadata.name?,
                    uid: h.metadata.uid?,
                })
            })
        {
            self.delete_pod(&d).await?;
        }
        Ok(())
    }
}

/// The pod a claim's election names (the copy's source), for an Event about its copy; `pod`
/// when the claim does not name one.
fn elected_pod_ref(
    claim: &PersistentVolumeClaim,
    pod: &Pod,
) -> k8s_openapi::api::core::v1::ObjectReference {
    let a = claim.annotations();
    match (
        a.get(COPY_POD_ANNOTATION),
        a.get(COPY_POD_NAME_ANNOTATION),
        a.get(SOURCE_NAMESPACE_LABEL),
    ) {
        (Some(uid), Some(name), Some(namespace)) => k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid: Some(uid.clone()),
            ..Default::default()
        },
        _ => kube::Resource::object_ref(pod, &()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn the_sooner_look_wins() {
        let wait = Action::await_change();
        let (one, ten, thirty) = (
            Action::requeue(Duration::from_secs(1)),
            Action::requeue(REQUEUE_WAITING),
            Action::requeue(REQUEUE_CAPTURE_RETRY),
        );
        assert_eq!(sooner(wait.clone(), wait.clone()), wait);
        assert_eq!(sooner(wait.clone(), ten.clone()), ten);
        assert_eq!(sooner(thirty.clone(), wait), thirty);
        assert_eq!(sooner(thirty.clone(), ten.clone()), ten);
        assert_eq!(sooner(one.clone(), thirty), one);
        let odd = Action::requeue(Duration::from_secs(7));
        assert_eq!(sooner(odd.clone(), odd.clone()), odd);
        assert_eq!(
            sooner(odd, Action::requeue(Duration::from_secs(8))),
            one,
            "two unknown delays: the shortest known"
        );
    }

    #[test]
    fn the_copy_is_reported_on_the_elected_pod() {
        let pod = |ns: &str, name: &str, uid: &str| Pod {
            metadata: kube::api::ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let other = pod("team-a", "escaping", "u2");
        let mut claim = PersistentVolumeClaim::default();
        assert_eq!(
            elected_pod_ref(&claim, &other).name.as_deref(),
            Some("escaping")
        );
        claim.metadata.annotations = Some(BTreeMap::from([
            (COPY_POD_ANNOTATION.to_owned(), "u1".to_owned()),
            (COPY_POD_NAME_ANNOTATION.to_owned(), "nim-0".to_owned()),
            (SOURCE_NAMESPACE_LABEL.to_owned(), "team-a".to_owned()),
        ]));
        let r = elected_pod_ref(&claim, &other);
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (Some("Pod"), Some("team-a"), Some("nim-0"), Some("u1"))
        );
        assert_eq!(r.api_version.as_deref(), Some("v1"));
    }

    #[test]
    fn each_kind_has_its_own_events() {
        let (m, c) = (
            event_words(CaptureKind::Model),
            event_words(CaptureKind::CacheSet),
        );
        assert_eq!(m.0, "ModelCaptured", "the model's words are unchanged");
        assert_eq!(m.1, "ModelCaptureRefused");
        assert_eq!(c.0, "CacheSetCaptured");
        assert_ne!(m, c);
    }

    /// The selection the agent copies a compile-cache set through, on the real filesystem: the
    /// compile caches travel; credentials (the NGC CLI's config, a Hugging Face token, a key in
    /// a cache directory), other directories of the scratch volume and links (one pointing out
    /// of the tree) do not; the measure that sizes the claim counts only what travels.
    #[test]
    fn a_set_copies_its_compile_caches_and_never_a_credential() {
        use warmcache_modelvolume::cacheset::travels;
        let base = std::env::temp_dir().join(format!("mvc-cacheset-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let scratch = base.join("nvsnap-cache");
        let dest = base.join("volume");
        let write = |rel: &str, bytes: &[u8]| {
            let p = scratch.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        };
        for (rel, bytes) in [
            ("torchinductor/fxgraph/ab/entry", &b"graph"[..]),
            (".triton/cache/k1/kernel.cubin", b"cubin"),
            (
                ".cache/vllm/torch_compile_cache/rank_0_0/model",
                b"compiled",
            ),
            (".nv/ComputeCache/index", b"ptx"),
            ("hf_modules/transformers_modules/m/modeling.py", b"code"),
            // Never travels.
            (".ngc/config", b"apikey = nvapi-xxx"),
            (".cache/huggingface/token", b"hf_xxx"),
            ("torchinductor/x.pem", b"-----BEGIN PRIVATE KEY-----"),
            ("torchinductor/.aws/credentials", b"aws"),
            (".cache/pip/wheel", b"wheel"),
            ("notes.txt", b"other"),
        ] {
            write(rel, bytes);
        }
        let outside = base.join("node-secret");
        std::fs::write(&outside, b"node").unwrap();
        symlink(&outside, scratch.join("torchinductor/out")).unwrap();
        symlink("/etc", scratch.join(".triton/cache/etc")).unwrap();
        std::fs::create_dir_all(&dest).unwrap();

        let tree = warmcache_nodefs::open_dir_beneath(&scratch, "").unwrap();
        let measured = warmcache_nodefs::measure_dir_selected(&tree, &travels).unwrap();
        let report = warmcache_nodefs::copy_tree_selected(&scratch, &dest, "s1", &travels).unwrap();
        assert_eq!((report.files, report.symlinks), (5, 0), "{report:?}");
        let copied = |rel: &str| dest.join(rel).symlink_metadata().is_ok();
        for rel in [
            "torchinductor/fxgraph/ab/entry",
            ".triton/cache/k1/kernel.cubin",
            ".cache/vllm/torch_compile_cache/rank_0_0/model",
            ".nv/ComputeCache/index",
            "hf_modules/transformers_modules/m/modeling.py",
        ] {
            assert!(copied(rel), "{rel} travels");
        }
        assert_eq!(
            std::fs::read(dest.join(".triton/cache/k1/kernel.cubin")).unwrap(),
            b"cubin"
        );
        for rel in [
            ".ngc",
            ".cache/huggingface",
            "torchinductor/x.pem",
            "torchinductor/.aws",
            ".cache/pip",
            "notes.txt",
            "torchinductor/out",
            ".triton/cache/etc",
        ] {
            assert!(!copied(rel), "{rel} never travels");
        }
        // Everything that travels is less than the scratch volume, and more than its files.
        assert!(measured < warmcache_nodefs::measure_dir(&tree).unwrap());
        assert!(measured > 5 * 3, "{measured}");
        assert_eq!(
            warmcache_nodefs::is_complete(&dest).unwrap(),
            Some(report.bytes)
        );
        warmcache_nodefs::verify_manifest(&dest).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }
}
