//! Which bindings a pod reads, from its annotations: the model copy's
//! ([`BINDING_ANNOTATION`]) and its compile-cache set's ([`CACHE_BINDING_ANNOTATION`]), and
//! whether it is a capture source of one of them. The binding controller's pod index, its
//! reconcile and the reaper all ask the same questions here.

use std::collections::BTreeMap;

use warmcache_api_modelcache::sha256_digest;

use crate::keys::{
    BINDING_ANNOTATION, BINDING_UID_ANNOTATION, CACHE_BINDING_ANNOTATION,
    CACHE_BINDING_UID_ANNOTATION, CACHE_CAPTURE_LABEL, CACHE_HANDLE_ANNOTATION, CAPTURE_LABEL,
    HANDLE_ANNOTATION, URI_ANNOTATION,
};

/// A pod's labels or annotations, read by key: the pod's own maps, or the few entries a cache
/// keeps of them (the binding controller's pod cache).
pub trait Entries {
    /// The value of `key`.
    fn entry(&self, key: &str) -> Option<&str>;
}

impl Entries for BTreeMap<String, String> {
    fn entry(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// How a pod reads a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// The model copy (its download step, if any, fills it).
    Model,
    /// The compile-cache set (filled only by capture; never by a writer Job).
    CacheSet,
}

/// The keys of one relation: the binding's name and UID annotations, the capture-source label
/// and the handle annotation.
#[derive(Debug, Clone, Copy)]
pub struct Keys {
    /// Annotation naming the binding.
    pub binding: &'static str,
    /// Annotation recording the binding's UID.
    pub uid: &'static str,
    /// Label (`"true"`) of a capture source.
    pub capture: &'static str,
    /// Annotation holding the cache handle.
    pub handle: &'static str,
}

impl Reads {
    /// Both relations, the model copy first.
    pub const ALL: [Reads; 2] = [Reads::Model, Reads::CacheSet];

    /// The pod keys of this relation.
    pub const fn keys(self) -> Keys {
        match self {
            Reads::Model => Keys {
                binding: BINDING_ANNOTATION,
                uid: BINDING_UID_ANNOTATION,
                capture: CAPTURE_LABEL,
                handle: HANDLE_ANNOTATION,
            },
            Reads::CacheSet => Keys {
                binding: CACHE_BINDING_ANNOTATION,
                uid: CACHE_BINDING_UID_ANNOTATION,
                capture: CACHE_CAPTURE_LABEL,
                handle: CACHE_HANDLE_ANNOTATION,
            },
        }
    }
}

/// The names of the bindings a pod's annotations name (model copy first).
pub fn bindings_named(annotations: &impl Entries) -> Vec<&str> {
    Reads::ALL
        .iter()
        .filter_map(|how| annotations.entry(how.keys().binding))
        .collect()
}

/// How a pod with these annotations reads the binding `name` of UID `uid`: named by it, with
/// that UID recorded or none yet (the binding was being created). `None`: it does not.
pub fn reads(annotations: &impl Entries, name: &str, uid: Option<&str>) -> Option<Reads> {
    Reads::ALL.into_iter().find(|how| {
        let keys = how.keys();
        annotations.entry(keys.binding) == Some(name)
            && annotations
                .entry(keys.uid)
                .is_none_or(|recorded| Some(recorded) == uid)
    })
}

/// Whether a pod reading a binding `how` is a capture source of the binding whose
/// `cacheHandleDigest` is `digest`: labelled as one, with a handle of that digest.
pub fn is_capture_source(
    how: Reads,
    labels: &impl Entries,
    annotations: &impl Entries,
    digest: &str,
) -> bool {
    let keys = how.keys();
    labels.entry(keys.capture) == Some("true")
        && annotations
            .entry(keys.handle)
            .is_some_and(|h| sha256_digest(h) == digest)
}

/// What a binding's `status.modelUri` shows, from a pod reading it `how` whose handle has the
/// binding's digest: the model's URI, or a compile-cache set's handle (`cache://...`).
pub fn shown_uri(how: Reads, annotations: &impl Entries, digest: &str) -> Option<String> {
    let h = annotations.entry(how.keys().handle)?;
    if sha256_digest(h) != digest {
        return None;
    }
    match how {
        Reads::Model => annotations.entry(URI_ANNOTATION).map(str::to_owned),
        Reads::CacheSet => Some(h.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_pod_reads_its_model_and_its_set_each_by_name_and_uid() {
        let a = map(&[
            (BINDING_ANNOTATION, "model-cache-m"),
            (BINDING_UID_ANNOTATION, "u1"),
            (CACHE_BINDING_ANNOTATION, "model-cache-s"),
        ]);
        assert_eq!(bindings_named(&a), ["model-cache-m", "model-cache-s"]);
        assert_eq!(reads(&a, "model-cache-m", Some("u1")), Some(Reads::Model));
        assert_eq!(reads(&a, "model-cache-m", Some("u2")), None, "another UID");
        assert_eq!(
            reads(&a, "model-cache-m", None),
            None,
            "a UID recorded, none known"
        );
        assert_eq!(
            reads(&a, "model-cache-s", Some("u9")),
            Some(Reads::CacheSet),
            "no set UID recorded yet"
        );
        assert_eq!(reads(&a, "model-cache-x", None), None);
        assert!(bindings_named(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn capture_sources_are_told_apart_by_kind_and_digest() {
        let set_handle = format!("cache://{}?rank=0", "a".repeat(64));
        let labels = map(&[(CACHE_CAPTURE_LABEL, "true")]);
        let a = map(&[
            (CACHE_HANDLE_ANNOTATION, &set_handle),
            (HANDLE_ANNOTATION, "hf://org/m?layout=hub&fill=capture"),
            (URI_ANNOTATION, "hf://org/m"),
        ]);
        let digest = sha256_digest(&set_handle);
        assert!(is_capture_source(Reads::CacheSet, &labels, &a, &digest));
        assert!(!is_capture_source(Reads::Model, &labels, &a, &digest));
        assert!(!is_capture_source(
            Reads::CacheSet,
            &labels,
            &a,
            &sha256_digest("other")
        ));
        assert!(!is_capture_source(
            Reads::CacheSet,
            &BTreeMap::new(),
            &a,
            &digest
        ));
        assert_eq!(shown_uri(Reads::CacheSet, &a, &digest), Some(set_handle));
        let model = sha256_digest("hf://org/m?layout=hub&fill=capture");
        assert_eq!(
            shown_uri(Reads::Model, &a, &model).as_deref(),
            Some("hf://org/m")
        );
        assert_eq!(shown_uri(Reads::Model, &a, &digest), None);
    }
}
