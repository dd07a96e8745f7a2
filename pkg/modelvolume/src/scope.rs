//! Which pods are ours to consider, and with whom a namespace shares.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use warmcache_api_modelcache::SHARING_DOMAIN_LABEL;
use warmcache_api_modelcache::v2beta1::Workflow;
use warmcache_cli::text::shown;

use crate::keys::{ALWAYS_EXCLUDED_NAMESPACES, MANAGED_BY_LABEL, MANAGED_BY_VALUE, OPT_OUT};
use crate::options::Options;
use crate::skip::{Skip, SkipReason};

/// Who a namespace shares caches with: the workflow and the raw sharing domain the binding's
/// identity digests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SharingDomain {
    /// `regularModelCache` (the namespace alone) or `helmModelCache` (a labelled domain).
    pub workflow: Workflow,
    /// The namespace name, or the value of the sharing-domain label.
    pub domain: String,
}

/// The sharing domain of `namespace` from its labels: namespaces carrying the same non-empty
/// value of [`SHARING_DOMAIN_LABEL`] share (`helmModelCache`, domain = the value); any other
/// namespace shares only with itself (`regularModelCache`, domain = the namespace). An empty
/// value counts as no label: sharing is never widened by accident.
pub fn sharing_domain(namespace: &str, labels: &BTreeMap<String, String>) -> SharingDomain {
    match labels.get(SHARING_DOMAIN_LABEL).map(|v| v.trim()) {
        Some(v) if !v.is_empty() => SharingDomain {
            workflow: Workflow::HelmModelCache,
            domain: v.to_owned(),
        },
        _ => SharingDomain {
            workflow: Workflow::RegularModelCache,
            domain: namespace.to_owned(),
        },
    }
}

/// Whether a resource quantity is zero: its number (before any suffix or exponent) has digits
/// and all of them are `0`. A quantity that does not start with a number is not known to be
/// zero, so it counts as a request.
fn quantity_is_zero(q: &str) -> bool {
    let q = q.trim();
    let q = q.strip_prefix(['+', '-']).unwrap_or(q);
    let number = q
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .unwrap_or_default();
    number.bytes().any(|b| b.is_ascii_digit()) && number.bytes().all(|b| b == b'0' || b == b'.')
}

fn requests_gpu(c: &Container, resources: &[String]) -> bool {
    let Some(r) = &c.resources else {
        return false;
    };
    [&r.limits, &r.requests].into_iter().flatten().any(|m| {
        m.iter()
            .any(|(k, q)| resources.iter().any(|g| g == k) && !quantity_is_zero(&q.0))
    })
}

/// The main container: the first container requesting one of `resources` (non-zero, in limits
/// or requests); `None` when none does (the pod is not a GPU pod).
pub fn gpu_container(pod: &Pod, resources: &[String]) -> Option<usize> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .position(|c| requests_gpu(c, resources))
}

fn is_true(v: Option<&String>) -> bool {
    v.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Whether `pod` in `namespace` (labels `namespace_labels`) is ours to consider; `Ok(main)` with
/// the main container's index, else the scope reason. Checked in order: excluded namespace,
/// namespace opt-out, warmcache's own pods, pod opt-out (label or annotation), Windows pods, GPU
/// request.
pub(crate) fn in_scope(
    pod: &Pod,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
    options: &Options,
) -> Result<usize, Skip> {
    let excluded = ALWAYS_EXCLUDED_NAMESPACES.contains(&namespace)
        || options.webhook_namespace.as_deref() == Some(namespace)
        || options.control_namespace == namespace;
    if excluded {
        return Err(Skip::new(
            SkipReason::NamespaceExcluded,
            format!(
                "namespace {}: kube-system, the webhook's namespace and the control namespace are never rewritten",
                shown(namespace)
            ),
        ));
    }
    if is_true(namespace_labels.get(OPT_OUT)) {
        return Err(Skip::new(
            SkipReason::NamespaceOptedOut,
            format!(
                "namespace {} carries the label {OPT_OUT}=true",
                shown(namespace)
            ),
        ));
    }
    let labels = pod.metadata.labels.as_ref();
    if labels
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .map(String::as_str)
        == Some(MANAGED_BY_VALUE)
    {
        return Err(Skip::new(
            SkipReason::OwnPod,
            format!(
                "metadata.labels[{MANAGED_BY_LABEL}]: the pod is warmcache's own ({MANAGED_BY_VALUE})"
            ),
        ));
    }
    if is_true(labels.and_then(|l| l.get(OPT_OUT))) {
        return Err(Skip::new(
            SkipReason::PodOptedOut,
            format!("metadata.labels[{OPT_OUT}]: the pod opted out of model sharing"),
        ));
    }
    if is_true(
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(OPT_OUT)),
    ) {
        return Err(Skip::new(
            SkipReason::PodOptedOut,
            format!("metadata.annotations[{OPT_OUT}]: the pod opted out of model sharing"),
        ));
    }
    let os = pod
        .spec
        .as_ref()
        .and_then(|s| s.os.as_ref())
        .map(|o| o.name.as_str());
    if os == Some("windows") {
        return Err(Skip::new(
            SkipReason::WindowsPod,
            "spec.os.name: a Windows pod; the containers model sharing adds are Linux containers",
        ));
    }
    gpu_container(pod, &options.gpu_resources).ok_or_else(|| {
        Skip::new(
            SkipReason::NotGpuPod,
            format!(
                "no container requests {}",
                options
                    .gpu_resources
                    .iter()
                    .map(|r| shown(r))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_quantities() {
        for q in ["0", "0.0", "0m", " 0 ", "+0", "0Ki"] {
            assert!(quantity_is_zero(q), "{q}");
        }
        for q in ["1", "0.5", "500m", "", "abc", "2"] {
            assert!(!quantity_is_zero(q), "{q}");
        }
    }

    #[test]
    fn sharing_domains() {
        let none = BTreeMap::new();
        assert_eq!(
            sharing_domain("team-a", &none),
            SharingDomain {
                workflow: Workflow::RegularModelCache,
                domain: "team-a".into()
            }
        );
        let labelled = BTreeMap::from([(SHARING_DOMAIN_LABEL.to_owned(), "research".to_owned())]);
        assert_eq!(
            sharing_domain("team-a", &labelled),
            SharingDomain {
                workflow: Workflow::HelmModelCache,
                domain: "research".into()
            }
        );
        let empty = BTreeMap::from([(SHARING_DOMAIN_LABEL.to_owned(), " ".to_owned())]);
        assert_eq!(
            sharing_domain("team-a", &empty).workflow,
            Workflow::RegularModelCache
        );
    }
}
