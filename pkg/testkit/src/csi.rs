//! The real node's TEST CSI driver instances: a simulation of the storage behaviours the seeds
//! measured, built from `hack/node/csi-test-driver` (Go) and started by [`RealNode`].
//!
//! Each instance is one CSI driver name with its own socket, state directory, CSIDriver object,
//! StorageClass (`reclaimPolicy: Retain`, `volumeBindingMode: Immediate`) and
//! external-provisioner; the namespaced-block instance also has an external-attacher, so its
//! pods get real VolumeAttachments.
//!
//! [`RealNode`]: crate::RealNode

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::TestkitError;

/// One instance of the test CSI driver on the real node. See `docs/development.md`, "The test
/// CSI driver", for which seed measurement each reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TestCsiDriver {
    /// A shared file system (Weka, OCI File Storage with fsGroup support): ReadWriteMany and
    /// ReadOnlyMany, a volume handle without namespace that reader PVs reuse, no attach,
    /// `fsGroupPolicy: File` (the kubelet hands a fresh root-owned export to the pod's fsGroup).
    SharedFs,
    /// The same shared file system with `fsGroupPolicy: ReadWriteOnceWithFSType` (OCI File
    /// Storage): the kubelet applies no fsGroup to a ReadWriteMany volume, so a fresh export
    /// stays owned by root (mode 0755) and a non-root writer gets EACCES.
    RootOwnedFs,
    /// A namespaced block volume (NVMesh): ReadWriteOnce and ReadOnlyMany, a volume handle
    /// `<id>:<namespace>` whose last segment must be the consuming pod's namespace, real
    /// attachments (`attachRequired: true`) with one read-write attachment at a time: a
    /// read-only attach of a volume attached read-write anywhere is refused. Reader mount
    /// options `ro`, `norecovery` (only with `ro`) and `nouuid` are accepted, as XFS takes them.
    NamespacedBlock,
    /// A multi-tenant shared file system (profile `tenant-fs`): ReadWriteMany and ReadOnlyMany,
    /// handles without namespace, no attach, `fsGroupPolicy: File`, but each consuming namespace
    /// sees its own tenant directory of a volume, so a reader PV in another namespace that reuses
    /// the writer's handle binds, mounts and sees an empty export. Storage that must fail
    /// qualification (`binding-controller qualify`).
    TenantFs,
}

impl TestCsiDriver {
    /// Every instance, in start order.
    pub const ALL: [TestCsiDriver; 4] = [
        TestCsiDriver::SharedFs,
        TestCsiDriver::RootOwnedFs,
        TestCsiDriver::NamespacedBlock,
        TestCsiDriver::TenantFs,
    ];

    /// The CSI driver name (the CSIDriver object, the PV's `spec.csi.driver`, the
    /// StorageClass's provisioner).
    pub fn driver_name(self) -> &'static str {
        match self {
            TestCsiDriver::SharedFs => "shared-fs.csi-test.warmcache.io",
            TestCsiDriver::RootOwnedFs => "root-owned-fs.csi-test.warmcache.io",
            TestCsiDriver::NamespacedBlock => "namespaced-block.csi-test.warmcache.io",
            TestCsiDriver::TenantFs => "tenant-fs.csi-test.warmcache.io",
        }
    }

    /// The StorageClass the node creates for this instance.
    pub fn storage_class(self) -> &'static str {
        match self {
            TestCsiDriver::SharedFs => "test-shared-fs",
            TestCsiDriver::RootOwnedFs => "test-root-owned-fs",
            TestCsiDriver::NamespacedBlock => "test-namespaced-block",
            TestCsiDriver::TenantFs => "test-tenant-fs",
        }
    }

    /// The driver's `--profile`.
    pub fn profile(self) -> &'static str {
        match self {
            TestCsiDriver::SharedFs | TestCsiDriver::RootOwnedFs => "shared-fs",
            TestCsiDriver::NamespacedBlock => "namespaced-block",
            TestCsiDriver::TenantFs => "tenant-fs",
        }
    }

    /// Whether the CSIDriver says `attachRequired: true` (VolumeAttachments, external-attacher).
    pub fn attach_required(self) -> bool {
        matches!(self, TestCsiDriver::NamespacedBlock)
    }

    /// The CSIDriver's `fsGroupPolicy`.
    pub fn fs_group_policy(self) -> &'static str {
        match self {
            TestCsiDriver::SharedFs | TestCsiDriver::TenantFs => "File",
            TestCsiDriver::RootOwnedFs | TestCsiDriver::NamespacedBlock => {
                "ReadWriteOnceWithFSType"
            }
        }
    }

    /// The access mode a writer's claim uses on this storage.
    pub fn writer_access_mode(self) -> &'static str {
        match self {
            TestCsiDriver::SharedFs | TestCsiDriver::RootOwnedFs | TestCsiDriver::TenantFs => {
                "ReadWriteMany"
            }
            TestCsiDriver::NamespacedBlock => "ReadWriteOnce",
        }
    }

    /// For a volume handle the driver issued, the handle a reader PV in `namespace` must use:
    /// the same handle on a shared file system, the last `:` segment rewritten on namespaced
    /// block storage.
    pub fn reader_volume_handle(self, handle: &str, namespace: &str) -> String {
        match self {
            TestCsiDriver::NamespacedBlock => match handle.rsplit_once(':') {
                Some((id, _)) => format!("{id}:{namespace}"),
                None => format!("{handle}:{namespace}"),
            },
            _ => handle.to_owned(),
        }
    }

    /// Short name used for files and processes (`shared-fs`, `root-owned-fs`,
    /// `namespaced-block`, `tenant-fs`).
    pub fn short_name(self) -> &'static str {
        match self {
            TestCsiDriver::SharedFs => "shared-fs",
            TestCsiDriver::RootOwnedFs => "root-owned-fs",
            TestCsiDriver::NamespacedBlock => "namespaced-block",
            TestCsiDriver::TenantFs => "tenant-fs",
        }
    }

    pub(crate) fn csi_driver_object(self) -> Value {
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {
                "name": self.driver_name(),
                "labels": { "warmcache.io/testkit": "true" },
                "annotations": {
                    "warmcache.io/test-driver": "a TEST CSI driver: a simulation of storage behaviours on local directories",
                },
            },
            "spec": {
                "attachRequired": self.attach_required(),
                "podInfoOnMount": true,
                "fsGroupPolicy": self.fs_group_policy(),
                "volumeLifecycleModes": ["Persistent"],
            },
        })
    }

    pub(crate) fn storage_class_object(self) -> Value {
        let mut parameters = serde_json::Map::new();
        if matches!(self, TestCsiDriver::NamespacedBlock) {
            // The kubelet applies fsGroup to a ReadWriteOnce volume only with an fsType.
            parameters.insert("csi.storage.k8s.io/fstype".into(), json!("xfs"));
        }
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": self.storage_class(),
                "labels": { "warmcache.io/testkit": "true" },
            },
            "provisioner": self.driver_name(),
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
            "parameters": parameters,
        })
    }
}

/// One NodePublishVolume call as the test driver received it (its publish journal), so a test
/// can assert what the kubelet asked for, not only what the pod saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiPublish {
    /// The volume handle.
    pub volume_handle: String,
    /// The kubelet's target path.
    pub target_path: String,
    /// The request's `readonly` flag (from the pod's `persistentVolumeClaim.readOnly`).
    pub readonly: bool,
    /// The capability's mount flags (the PV's `mountOptions`).
    pub mount_flags: Vec<String>,
    /// Whether the driver mounted the volume read-only.
    pub mounted_read_only: bool,
    /// For attach profiles: whether the attachment was read-only (`csi.readOnly` of the PV).
    pub attached_read_only: Option<bool>,
    /// Pod namespace, name and uid from the volume context.
    pub pod_namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The pod's uid.
    pub pod_uid: String,
    /// The error returned to the kubelet, if the publish failed.
    pub error: Option<String>,
    /// Whether the volume is encrypted (the namespaced-block profile: created with a key in
    /// its provisioner secret; a publish without that key is refused).
    pub encrypted: bool,
}

pub(crate) fn read_publish_journal(path: &Path) -> Result<Vec<CsiPublish>, TestkitError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TestkitError::io(format!("reading {}", path.display()), e)),
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| {
            TestkitError::InvalidArgument(format!("{} line {}: {e}", path.display(), n + 1))
        })?;
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        out.push(CsiPublish {
            volume_handle: s("volumeHandle"),
            target_path: s("targetPath"),
            readonly: v["readonly"].as_bool().unwrap_or(false),
            mount_flags: v["mountFlags"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|f| f.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            mounted_read_only: v["mountedReadOnly"].as_bool().unwrap_or(false),
            attached_read_only: v["attachedReadOnly"].as_bool(),
            pod_namespace: s("podNamespace"),
            pod_name: s("podName"),
            pod_uid: s("podUid"),
            error: v["error"].as_str().map(str::to_owned),
            encrypted: v["encrypted"].as_bool().unwrap_or(false),
        });
    }
    Ok(out)
}

/// The driver instance's state directory under the node's directory.
pub(crate) fn state_dir(node_dir: &Path, driver: TestCsiDriver) -> PathBuf {
    node_dir.join("csi").join(driver.short_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_handles() {
        let b = TestCsiDriver::NamespacedBlock;
        assert_eq!(b.reader_volume_handle("pvc-1:ns-a", "ns-b"), "pvc-1:ns-b");
        assert_eq!(
            TestCsiDriver::SharedFs.reader_volume_handle("pvc-1", "ns-b"),
            "pvc-1"
        );
    }

    #[test]
    fn journal_lines_parse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.jsonl");
        assert!(read_publish_journal(&path).unwrap().is_empty());
        std::fs::write(
            &path,
            r#"{"volumeHandle":"pvc-1","targetPath":"/t","readonly":true,"mountFlags":["ro"],"mountedReadOnly":true,"podNamespace":"n","podName":"p","podUid":"u"}
{"volumeHandle":"pvc-2:n","readonly":false,"mountFlags":null,"mountedReadOnly":false,"attachedReadOnly":true,"error":"boom"}
"#,
        )
        .unwrap();
        let got = read_publish_journal(&path).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got[0].readonly && got[0].mounted_read_only);
        assert_eq!(got[0].mount_flags, vec!["ro".to_owned()]);
        assert_eq!(got[1].attached_read_only, Some(true));
        assert_eq!(got[1].error.as_deref(), Some("boom"));
    }
}
