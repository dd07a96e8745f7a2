//! What the catalog gives one provisioner and workflow, as printed by
//! `binding-controller catalog explain`.

use serde::Serialize;
use warmcache_api_modelcache::v2beta1::{AccessMode, Workflow};

use crate::digest::profile_digest;
use crate::error::quote;
use crate::flow::{Flow, derive_flow, required_access_modes, required_mount_options};
use crate::source::CatalogSnapshot;

/// The flow the catalog derives for one provisioner and workflow. Serializes to one JSON object
/// with the keys `provisioner`, `provider`, `workflow`, `transition`, `requiredAccessModes`,
/// `requiredMountOptions`, `profileDigest`, `catalogRevision`, in that order, plus `reason`
/// when the transition is `disabled`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The provisioner asked about.
    pub provisioner: String,
    /// Its provider label; `null` without a catalog entry.
    pub provider: Option<String>,
    /// The workflow asked about.
    pub workflow: Workflow,
    /// `rwxReadOnly`, `roxReadOnly` or `disabled`.
    pub transition: &'static str,
    /// What a binding would record in `spec.decision.requiredAccessModes` (empty when disabled).
    pub required_access_modes: Vec<AccessMode>,
    /// What a binding would record in `spec.decision.requiredMountOptions`.
    pub required_mount_options: Vec<String>,
    /// Profile digest of the entry for this workflow; `null` without a catalog entry.
    pub profile_digest: Option<String>,
    /// Revision of the whole catalog payload.
    pub catalog_revision: String,
    /// Why the transition is `disabled`; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Explains what `snapshot` gives `provisioner` for `workflow`.
pub fn explain(snapshot: &CatalogSnapshot, provisioner: &str, workflow: Workflow) -> Explanation {
    let Some(driver) = snapshot.catalog().driver(provisioner) else {
        return Explanation {
            provisioner: provisioner.to_owned(),
            provider: None,
            workflow,
            transition: crate::flow::DISABLED,
            required_access_modes: Vec::new(),
            required_mount_options: Vec::new(),
            profile_digest: None,
            catalog_revision: snapshot.revision().to_owned(),
            reason: Some(format!(
                "the catalog has no entry for provisioner {}: caching stays off for a StorageClass using it until the driver is qualified and listed",
                quote(provisioner)
            )),
        };
    };
    let flow = derive_flow(driver, workflow);
    Explanation {
        provisioner: provisioner.to_owned(),
        provider: Some(driver.provider.clone()),
        workflow,
        transition: flow.as_str(),
        required_access_modes: required_access_modes(flow).to_vec(),
        required_mount_options: required_mount_options(driver, flow),
        profile_digest: Some(profile_digest(driver, workflow, flow)),
        catalog_revision: snapshot.revision().to_owned(),
        reason: match flow {
            Flow::Disabled(why) => Some(why.to_string()),
            Flow::Enabled(_) => None,
        },
    }
}
