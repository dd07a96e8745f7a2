package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// Profile is one storage behaviour the test driver reproduces. Everything that differs between
// the simulated storage systems is decided here, so the gRPC services stay generic.
type Profile struct {
	// Name as given on the command line (--profile).
	Name string
	// Access modes the simulated storage qualifies; any other is refused with InvalidArgument.
	Modes []csi.VolumeCapability_AccessMode_Mode
	// NamespacedHandle: the volume handle is "<volume id>:<namespace>", the namespace being the
	// claim's at creation and the consuming pod's at publish (NVMesh). A reader in another
	// namespace needs a PV whose handle's last segment is rewritten to its own namespace.
	NamespacedHandle bool
	// Attach: the driver has ControllerPublish/Unpublish (real VolumeAttachments through the
	// external-attacher; the CSIDriver object must say attachRequired: true) and allows one
	// read-write attachment of a volume at a time.
	Attach bool
	// MountFlags the simulated file system accepts in a volume capability (PV mountOptions).
	MountFlags []string
	// TenantPerNamespace: a multi-tenant file service that maps each consuming namespace to its
	// own tenant directory of a volume. A pod sees <volume>/tenants/<pod namespace>, created
	// fresh (root-owned, 0755) on first publish, so a reader PV in another namespace that reuses
	// the writer's handle binds, mounts and sees an empty export: the failure a qualification run
	// must catch (a claim that binds is not evidence).
	TenantPerNamespace bool
	// Encryption: encryption at rest with per-volume keys, as a driver that takes a key from
	// the provisioner secret (see encryption.go). A volume created with a secret entry "key" is
	// encrypted: publishing it needs the same key (the PV's nodePublishSecretRef), deleting it
	// too (the provisioner secret). Profiles without it ignore every secret.
	Encryption bool
}

var profiles = map[string]Profile{
	// A shared file system (Weka, OCI File Storage): ReadWriteMany writers and ReadOnlyMany
	// readers, a handle without namespace that every reader PV reuses, no attach. Whether a
	// fresh export is usable by a non-root writer is decided by the CSIDriver's fsGroupPolicy
	// (File: kubelet applies the pod's fsGroup; ReadWriteOnceWithFSType: it does not for RWX, and
	// the root-owned export refuses the writer, as FSS does).
	"shared-fs": {
		Name: "shared-fs",
		Modes: []csi.VolumeCapability_AccessMode_Mode{
			csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
			csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		},
		MountFlags: []string{"ro"},
	},
	// A namespaced block volume (NVMesh): ReadWriteOnce writers and ReadOnlyMany readers, the
	// consuming namespace in the handle, real attachments with one read-write attachment at a
	// time, XFS reader options, and encryption at rest with a per-volume key when the
	// StorageClass names a provisioner secret (a simulation of a driver with per-volume keys,
	// not NVMesh's own mechanism).
	"namespaced-block": {
		Name: "namespaced-block",
		Modes: []csi.VolumeCapability_AccessMode_Mode{
			csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
			csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		},
		NamespacedHandle: true,
		Attach:           true,
		MountFlags:       []string{"ro", "norecovery", "nouuid"},
		Encryption:       true,
	},
	// A shared file system whose exports are per tenant (one tenant per namespace): ReadWriteMany
	// and ReadOnlyMany, a handle without namespace, no attach, but a pod in namespace B publishing
	// the writer's handle gets B's own empty tenant directory, never A's data. It must FAIL
	// qualification (the reader in another namespace does not see the writer's bytes).
	"tenant-fs": {
		Name: "tenant-fs",
		Modes: []csi.VolumeCapability_AccessMode_Mode{
			csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
			csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		},
		MountFlags:         []string{"ro"},
		TenantPerNamespace: true,
	},
}

func profileNames() []string {
	return []string{"shared-fs", "namespaced-block", "tenant-fs"}
}

// exportDir is the directory a pod in podNamespace sees of the volume whose directory is
// volumeDir: the volume's directory itself, or, for a tenant-per-namespace profile, the
// namespace's tenant directory under it.
func (p Profile) exportDir(volumeDir, podNamespace string) (string, error) {
	if !p.TenantPerNamespace {
		return volumeDir, nil
	}
	if !namespacePattern.MatchString(podNamespace) {
		return "", fmt.Errorf("profile %s maps each namespace to a tenant directory and needs the pod's namespace (the CSIDriver must say podInfoOnMount: true); got %q", p.Name, podNamespace)
	}
	return filepath.Join(volumeDir, "tenants", podNamespace), nil
}

// Volume ids are the external-provisioner's PV names (pvc-<uid>) or a test's own: DNS-label-ish
// names only, so an id can never leave the state directory.
var volumeIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,126}[a-z0-9])?$`)

// Namespaces are DNS labels.
var namespacePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Handle is a parsed volume handle.
type Handle struct {
	// ID names the volume's directory; shared by every handle of one volume.
	ID string
	// Namespace is the last ":" segment of a namespaced handle, empty otherwise.
	Namespace string
}

func (p Profile) handleFor(id, namespace string) string {
	if p.NamespacedHandle {
		return id + ":" + namespace
	}
	return id
}

// parseHandle splits a volume handle as the profile writes it.
func (p Profile) parseHandle(handle string) (Handle, error) {
	if !p.NamespacedHandle {
		if !volumeIDPattern.MatchString(handle) {
			return Handle{}, fmt.Errorf("volume handle %q is not a volume id of this driver (profile %s: no namespace segment)", handle, p.Name)
		}
		return Handle{ID: handle}, nil
	}
	i := strings.LastIndex(handle, ":")
	if i < 0 {
		return Handle{}, fmt.Errorf("volume handle %q has no namespace segment (profile %s: <volume id>:<namespace>)", handle, p.Name)
	}
	id, ns := handle[:i], handle[i+1:]
	if !volumeIDPattern.MatchString(id) {
		return Handle{}, fmt.Errorf("volume handle %q: %q is not a volume id of this driver", handle, id)
	}
	if !namespacePattern.MatchString(ns) {
		return Handle{}, fmt.Errorf("volume handle %q: namespace segment %q is not a namespace name", handle, ns)
	}
	return Handle{ID: id, Namespace: ns}, nil
}

// checkCapability refuses what the simulated storage does not support.
func (p Profile) checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return fmt.Errorf("volume capability missing")
	}
	if c.GetBlock() != nil {
		return fmt.Errorf("raw block access is not supported by this test driver (use a file system volume)")
	}
	if c.GetMount() == nil {
		return fmt.Errorf("volume capability has no access type")
	}
	mode := c.GetAccessMode().GetMode()
	if !p.supportsMode(mode) {
		return fmt.Errorf("access mode %s is not supported by profile %s (supported: %s)", mode, p.Name, p.modeList())
	}
	if _, err := p.readOnlyFromFlags(c.GetMount().GetMountFlags()); err != nil {
		return err
	}
	return nil
}

func (p Profile) supportsMode(mode csi.VolumeCapability_AccessMode_Mode) bool {
	for _, m := range p.Modes {
		if m == mode {
			return true
		}
	}
	return false
}

func (p Profile) modeList() string {
	names := make([]string, 0, len(p.Modes))
	for _, m := range p.Modes {
		names = append(names, m.String())
	}
	return strings.Join(names, ", ")
}

// readOnlyFromFlags validates mount flags and reports whether they ask for a read-only mount.
// The block profile accepts XFS's norecovery only together with ro, as XFS does.
func (p Profile) readOnlyFromFlags(flags []string) (bool, error) {
	ro, norecovery := false, false
	for _, f := range flags {
		known := false
		for _, k := range p.MountFlags {
			if f == k {
				known = true
			}
		}
		if !known {
			return false, fmt.Errorf("mount option %q is not supported by profile %s (supported: %s)", f, p.Name, strings.Join(p.MountFlags, ", "))
		}
		switch f {
		case "ro":
			ro = true
		case "norecovery":
			norecovery = true
		}
	}
	if norecovery && !ro {
		return false, fmt.Errorf("mount option norecovery needs ro (as XFS refuses it on a read-write mount)")
	}
	return ro, nil
}
