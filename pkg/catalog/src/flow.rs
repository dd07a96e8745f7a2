//! Flow derivation: which transition a driver entry gives a workflow.
//!
//! The catalog never declares a flow. It lists the access modes a qualification run proved, and
//! the flow follows:
//!
//! - ReadWriteMany qualified: `rwxReadOnly` for both workflows (one shared claim, mounted
//!   read-only by readers in any namespace). It wins when the ReadWriteOnce+ReadOnlyMany shape
//!   is qualified too.
//! - ReadWriteOnce and ReadOnlyMany qualified (no ReadWriteMany): `roxReadOnly` for
//!   `regularModelCache`; for `helmModelCache` only when the driver's volume handles encode the
//!   consuming namespace (provider `nvmesh`), because a reader in another namespace gets a
//!   volume derived from the writer's by rewriting that part of the handle.
//! - anything else: `disabled`.

use std::fmt;

use serde::Serialize;
use warmcache_api_modelcache::v2beta1::{AccessMode, Transition, Workflow};

use crate::loader::DriverProfile;

/// Provider label of NVMesh, the one provider whose CSI volume handles encode the namespace.
pub const NVMESH_PROVIDER: &str = "nvmesh";

/// Whether volumes of this provider can be shared across namespaces by deriving a reader
/// volume whose handle names the reader's namespace. Only NVMesh handles encode the namespace;
/// every other driver addresses one volume by one handle. The reader-volume derivation must use
/// the same predicate.
pub fn volume_handle_encodes_namespace(provider: &str) -> bool {
    provider == NVMESH_PROVIDER
}

/// Why no flow serves a workflow on a driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DisabledReason {
    /// The entry lists no access mode: nothing is qualified yet.
    NothingQualified,
    /// The entry lists modes, but neither ReadWriteMany nor ReadWriteOnce with ReadOnlyMany.
    NoFlowShape,
    /// helmModelCache on the ReadWriteOnce+ReadOnlyMany shape of a driver whose volume handles
    /// do not encode the namespace.
    CrossNamespaceNeedsReadWriteMany,
}

impl fmt::Display for DisabledReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NothingQualified => {
                "the catalog entry qualifies no access mode, so caching is off for this driver; qualify it and list the proven modes to enable it"
            }
            Self::NoFlowShape => {
                "the qualified access modes form no flow: caching needs ReadWriteMany, or ReadWriteOnce together with ReadOnlyMany"
            }
            Self::CrossNamespaceNeedsReadWriteMany => {
                "helmModelCache readers live in other namespaces: that needs ReadWriteMany, or ReadWriteOnce+ReadOnlyMany on a driver whose volume handles encode the namespace (provider nvmesh)"
            }
        })
    }
}

/// The derived flow of one driver for one workflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flow {
    /// A durable cache with this transition.
    Enabled(Transition),
    /// No durable cache on this driver for this workflow.
    Disabled(DisabledReason),
}

/// The spelling of the disabled flow (the two others are [`Transition::as_str`]).
pub const DISABLED: &str = "disabled";

impl Flow {
    /// `rwxReadOnly`, `roxReadOnly` or `disabled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Enabled(t) => t.as_str(),
            Self::Disabled(_) => DISABLED,
        }
    }

    /// The transition, when enabled.
    pub const fn transition(self) -> Option<Transition> {
        match self {
            Self::Enabled(t) => Some(t),
            Self::Disabled(_) => None,
        }
    }
}

impl Serialize for Flow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The flow a driver entry gives a workflow (module docs for the rules).
pub fn derive_flow(driver: &DriverProfile, workflow: Workflow) -> Flow {
    let rwx = driver.qualifies(AccessMode::ReadWriteMany);
    let rox_shape =
        driver.qualifies(AccessMode::ReadWriteOnce) && driver.qualifies(AccessMode::ReadOnlyMany);
    if rwx {
        return Flow::Enabled(Transition::RwxReadOnly);
    }
    if rox_shape {
        return match workflow {
            Workflow::RegularModelCache => Flow::Enabled(Transition::RoxReadOnly),
            Workflow::HelmModelCache if volume_handle_encodes_namespace(&driver.provider) => {
                Flow::Enabled(Transition::RoxReadOnly)
            }
            Workflow::HelmModelCache => {
                Flow::Disabled(DisabledReason::CrossNamespaceNeedsReadWriteMany)
            }
        };
    }
    if driver.access_modes.is_empty() {
        Flow::Disabled(DisabledReason::NothingQualified)
    } else {
        Flow::Disabled(DisabledReason::NoFlowShape)
    }
}

/// Access modes a binding records for a flow: `[ReadWriteMany]` for rwxReadOnly,
/// `[ReadWriteOnce, ReadOnlyMany]` for roxReadOnly, none when disabled.
pub fn required_access_modes(flow: Flow) -> &'static [AccessMode] {
    match flow {
        Flow::Enabled(t) => t.required_access_modes(),
        Flow::Disabled(_) => &[],
    }
}

/// Mount options a binding records for a flow: the driver's reader mount options, in catalog
/// order, for roxReadOnly (the controllers create those reader volumes); none for rwxReadOnly
/// (readers mount the shared claim read-only at the pod level) and when disabled.
pub fn required_mount_options(driver: &DriverProfile, flow: Flow) -> Vec<String> {
    match flow {
        Flow::Enabled(Transition::RoxReadOnly) => driver.reader_mount_options.clone(),
        Flow::Enabled(Transition::RwxReadOnly) | Flow::Disabled(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AccessMode::{ReadOnlyMany as Rox, ReadWriteMany as Rwx, ReadWriteOnce as Rwo};
    use Workflow::{HelmModelCache as Helm, RegularModelCache as Regular};

    fn driver(provider: &str, modes: &[AccessMode]) -> DriverProfile {
        DriverProfile {
            name: "csi.example.com".into(),
            provider: provider.into(),
            access_modes: modes.to_vec(),
            reader_mount_options: vec!["ro".into(), "norecovery".into()],
            encryption_supported: false,
            writer_identity: None,
        }
    }

    /// Every row of the derivation table of reference section (b).
    #[test]
    fn derivation_table() {
        let rwx = "rwxReadOnly";
        let rox = "roxReadOnly";
        let off = "disabled";
        let rows: [(&str, &[AccessMode], &str, &str); 9] = [
            ("weka", &[Rwx], rwx, rwx),
            ("weka", &[Rwx, Rwo, Rox], rwx, rwx),
            ("weka", &[Rwo, Rox], rox, off),
            ("nvmesh", &[Rwo, Rox], rox, rox),
            ("ociFss", &[Rwo], off, off),
            ("weka", &[Rox], off, off),
            ("ociLustre", &[], off, off),
            ("nvmesh", &[], off, off),
            ("someVendor", &[Rwx, Rox], rwx, rwx),
        ];
        for (provider, modes, regular, helm) in rows {
            let d = driver(provider, modes);
            assert_eq!(
                derive_flow(&d, Regular).as_str(),
                regular,
                "{provider} {modes:?}"
            );
            assert_eq!(derive_flow(&d, Helm).as_str(), helm, "{provider} {modes:?}");
        }
    }

    #[test]
    fn disabled_reasons_are_specific() {
        assert_eq!(
            derive_flow(&driver("ociLustre", &[]), Regular),
            Flow::Disabled(DisabledReason::NothingQualified)
        );
        assert_eq!(
            derive_flow(&driver("ociFss", &[Rwo]), Helm),
            Flow::Disabled(DisabledReason::NoFlowShape)
        );
        assert_eq!(
            derive_flow(&driver("weka", &[Rox, Rwo]), Helm),
            Flow::Disabled(DisabledReason::CrossNamespaceNeedsReadWriteMany)
        );
    }

    #[test]
    fn order_of_modes_does_not_matter() {
        for modes in [[Rwx, Rwo, Rox], [Rox, Rwo, Rwx], [Rwo, Rwx, Rox]] {
            let d = driver("weka", &modes);
            assert_eq!(
                derive_flow(&d, Regular),
                Flow::Enabled(Transition::RwxReadOnly)
            );
        }
        let d = driver("weka", &[Rox, Rwo]);
        assert_eq!(
            derive_flow(&d, Regular),
            Flow::Enabled(Transition::RoxReadOnly)
        );
    }

    #[test]
    fn required_modes_and_options_per_flow() {
        let d = driver("nvmesh", &[Rwo, Rox]);
        let rox = derive_flow(&d, Helm);
        assert_eq!(required_access_modes(rox), [Rwo, Rox]);
        assert_eq!(required_mount_options(&d, rox), ["ro", "norecovery"]);

        let d = driver("weka", &[Rwx, Rwo, Rox]);
        let rwx = derive_flow(&d, Regular);
        assert_eq!(required_access_modes(rwx), [Rwx]);
        assert!(required_mount_options(&d, rwx).is_empty());

        let d = driver("ociLustre", &[]);
        let off = derive_flow(&d, Regular);
        assert!(required_access_modes(off).is_empty());
        assert!(required_mount_options(&d, off).is_empty());
    }

    #[test]
    fn only_nvmesh_handles_encode_the_namespace() {
        assert!(volume_handle_encodes_namespace("nvmesh"));
        for p in ["weka", "NVMesh", "nvmesh ", "ociFss", ""] {
            assert!(!volume_handle_encodes_namespace(p), "{p}");
        }
    }
}
