//! What one run did and what it left: the verdict, the lines naming what is left, the retained
//! volumes and the one-line summary.

use std::fmt::Write as _;

/// An object the run could not remove, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    /// `Kind name` (`KVCacheBackend kvc-a`, `ModelCacheBinding ns/name`, `Namespace ns`).
    pub object: String,
    /// Why it is still there: its finalizers, its state, the API error, the timeout.
    pub why: String,
}

/// A PersistentVolume that keeps model data, kept on purpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetainedVolume {
    /// The PV's name.
    pub name: String,
    /// `spec.persistentVolumeReclaimPolicy`.
    pub reclaim_policy: String,
    /// `status.phase`.
    pub phase: String,
    /// `namespace/name` of the claim it is (or was) bound to.
    pub claim: Option<String>,
}

/// The result of one run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// The control namespace.
    pub control_namespace: String,
    /// KVCacheBackends that were there and are gone.
    pub backends_removed: Vec<String>,
    /// KVCacheBackends whose finalizer `--force` removed.
    pub backend_finalizers_removed: Vec<String>,
    /// Bindings whose finalizer was removed.
    pub binding_finalizers_removed: Vec<String>,
    /// Whether the control namespace is gone (deleted now, or already).
    pub namespace_gone: bool,
    /// What is left, and why. Empty: the run did everything.
    pub left: Vec<Left>,
    /// Steps not started because an earlier one did not finish.
    pub not_started: Vec<String>,
    /// The volumes keeping model data.
    pub retained: Vec<RetainedVolume>,
    /// Why the volumes could not be listed, when they could not.
    pub retained_error: Option<String>,
}

impl Report {
    /// An empty report for `control_namespace`.
    pub fn new(control_namespace: &str) -> Self {
        Self {
            control_namespace: control_namespace.to_owned(),
            ..Self::default()
        }
    }

    /// Whether everything was done.
    pub fn done(&self) -> bool {
        self.left.is_empty() && self.not_started.is_empty()
    }

    /// The exit code: 0 done, 1 something left.
    pub fn code(&self) -> u8 {
        if self.done() {
            warmcache_cli::exit::OK
        } else {
            warmcache_cli::exit::REFUSED
        }
    }

    /// Records what is left.
    pub fn leave(&mut self, object: impl Into<String>, why: impl Into<String>) {
        self.left.push(Left {
            object: object.into(),
            why: why.into(),
        });
    }

    /// The lines about the retained volumes: each volume, then the command removing them all.
    pub fn retained_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(error) = &self.retained_error {
            lines.push(format!(
                "could not list the PersistentVolumes that keep model data ({error}); list them with: kubectl get pv -l app.kubernetes.io/managed-by=warmcache"
            ));
            return lines;
        }
        if self.retained.is_empty() {
            lines.push("no PersistentVolume keeps model data".to_owned());
            return lines;
        }
        lines.push(format!(
            "kept on purpose: {} PersistentVolume(s) holding model data (uninstall never deletes data):",
            self.retained.len()
        ));
        for pv in &self.retained {
            let mut line = format!(
                "  PersistentVolume {} (reclaimPolicy {}, {}",
                pv.name, pv.reclaim_policy, pv.phase
            );
            if let Some(claim) = &pv.claim {
                let _ = write!(line, ", claim {claim}");
            }
            line.push(')');
            lines.push(line);
        }
        let names: Vec<&str> = self.retained.iter().map(|pv| pv.name.as_str()).collect();
        lines.push(format!(
            "to remove them: kubectl delete pv {}",
            names.join(" ")
        ));
        lines.push(
            "  (a Retain volume's storage stays on the storage system after its PV is deleted; free it there)"
                .to_owned(),
        );
        lines
    }

    /// The one-line summary, the last line of the output.
    pub fn summary(&self) -> String {
        let kept = if self.retained_error.is_some() {
            "PersistentVolumes of model data not listed".to_owned()
        } else {
            format!(
                "{} PersistentVolume(s) of model data kept",
                self.retained.len()
            )
        };
        if self.done() {
            let namespace = if self.namespace_gone {
                format!("namespace {} gone", self.control_namespace)
            } else {
                format!("namespace {} kept", self.control_namespace)
            };
            return format!(
                "uninstall-hook: done: {} KVCacheBackend(s) removed ({} by --force), finalizer removed from {} ModelCacheBinding(s), {namespace}; {kept}",
                self.backends_removed.len(),
                self.backend_finalizers_removed.len(),
                self.binding_finalizers_removed.len(),
            );
        }
        let left: Vec<&str> = self.left.iter().map(|l| l.object.as_str()).collect();
        let mut line = format!(
            "uninstall-hook: NOT DONE: {} left: {}",
            left.len(),
            left.join(", ")
        );
        if !self.not_started.is_empty() {
            let _ = write!(line, "; not started: {}", self.not_started.join(", "));
        }
        let _ = write!(
            line,
            "; {kept}; fix the cause above and run helm uninstall again"
        );
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_run_exits_0_and_says_what_it_did() {
        let mut report = Report::new("ctl");
        report.backends_removed = vec!["a".into(), "b".into()];
        report.binding_finalizers_removed = vec!["ctl/x".into()];
        report.namespace_gone = true;
        report.retained.push(RetainedVolume {
            name: "pv-1".into(),
            reclaim_policy: "Retain".into(),
            phase: "Released".into(),
            claim: Some("ctl/rw-pvc-1".into()),
        });
        assert_eq!(report.code(), 0);
        assert_eq!(
            report.summary(),
            "uninstall-hook: done: 2 KVCacheBackend(s) removed (0 by --force), finalizer removed from 1 ModelCacheBinding(s), namespace ctl gone; 1 PersistentVolume(s) of model data kept"
        );
        let lines = report.retained_lines();
        assert_eq!(
            lines[1],
            "  PersistentVolume pv-1 (reclaimPolicy Retain, Released, claim ctl/rw-pvc-1)"
        );
        assert_eq!(lines[2], "to remove them: kubectl delete pv pv-1");
    }

    #[test]
    fn what_is_left_makes_exit_code_1_and_is_named() {
        let mut report = Report::new("ctl");
        report.leave(
            "KVCacheBackend kvc-a",
            "finalizers [worker.gpustack.ai/kvcache]",
        );
        report
            .not_started
            .push("strip the ModelCacheBinding finalizers".into());
        report.retained_error = Some("forbidden".into());
        assert_eq!(report.code(), 1);
        let summary = report.summary();
        assert!(
            summary.starts_with(
                "uninstall-hook: NOT DONE: 1 left: KVCacheBackend kvc-a; not started: strip"
            ),
            "{summary}"
        );
        assert!(summary.ends_with("run helm uninstall again"), "{summary}");
        assert!(report.retained_lines()[0].contains("kubectl get pv -l"));
    }
}
