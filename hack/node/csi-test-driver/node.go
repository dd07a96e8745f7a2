package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Pod information the kubelet adds to NodePublishVolume's volume context when the CSIDriver
// says podInfoOnMount: true.
const (
	ctxPodNamespace = "csi.storage.k8s.io/pod.namespace"
	ctxPodName      = "csi.storage.k8s.io/pod.name"
	ctxPodUID       = "csi.storage.k8s.io/pod.uid"
)

// Node is the CSI Node service: NodePublishVolume bind-mounts the volume's directory onto the
// target, read-only (a real MS_RDONLY bind remount) when the request says readonly or the
// capability carries the "ro" mount option. Nothing else makes a mount read-only: the driver
// never second-guesses the kubelet.
type Node struct {
	csi.UnimplementedNodeServer
	profile Profile
	nodeID  string
	store   *Store
}

func (n *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.nodeID}, nil
}

func (n *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func (n *Node) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	record := PublishRecord{
		Time:         time.Now().UTC(),
		VolumeHandle: req.GetVolumeId(),
		TargetPath:   req.GetTargetPath(),
		Readonly:     req.GetReadonly(),
		MountFlags:   req.GetVolumeCapability().GetMount().GetMountFlags(),
		PodNamespace: req.GetVolumeContext()[ctxPodNamespace],
		PodName:      req.GetVolumeContext()[ctxPodName],
		PodUID:       req.GetVolumeContext()[ctxPodUID],
	}
	err := n.publish(req, &record)
	if err != nil {
		record.Error = err.Error()
	}
	if jerr := n.store.journal(record); jerr != nil && err == nil {
		return nil, status.Error(codes.Internal, jerr.Error())
	}
	if err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// publish mounts the volume, filling the journal record's outcome (MountedRO, AttachedRO,
// Encrypted) as it learns it.
func (n *Node) publish(req *csi.NodePublishVolumeRequest, record *PublishRecord) error {
	target := req.GetTargetPath()
	if target == "" || !filepath.IsAbs(target) {
		return status.Errorf(codes.InvalidArgument, "target path %q must be absolute", target)
	}
	if req.GetStagingTargetPath() != "" {
		return status.Error(codes.InvalidArgument, "this driver has no STAGE_UNSTAGE_VOLUME; a staging path was given")
	}
	if err := n.profile.checkCapability(req.GetVolumeCapability()); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	h, err := n.profile.parseHandle(req.GetVolumeId())
	if err != nil {
		return status.Error(codes.NotFound, err.Error())
	}
	if n.profile.NamespacedHandle {
		podNS := req.GetVolumeContext()[ctxPodNamespace]
		if podNS == "" {
			return status.Errorf(codes.FailedPrecondition, "profile %s needs the pod's namespace (the CSIDriver must say podInfoOnMount: true)", n.profile.Name)
		}
		if podNS != h.Namespace {
			return status.Errorf(codes.FailedPrecondition,
				"volume handle %s names namespace %q but the pod is in %q: a reader in another namespace needs a PV whose handle's last segment is its own namespace",
				req.GetVolumeId(), h.Namespace, podNS)
		}
	}
	meta, err := n.store.readMeta(h.ID)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if meta == nil {
		return status.Errorf(codes.NotFound, "volume %s does not exist", h.ID)
	}
	record.Encrypted = meta.KeySHA256 != ""
	if n.profile.Attach {
		attachments, err := n.store.readAttachments()
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		for _, a := range attachments {
			if a.Handle == req.GetVolumeId() && a.NodeID == n.nodeID {
				ro := a.ReadOnly
				record.AttachedRO = &ro
			}
		}
		if record.AttachedRO == nil {
			return status.Errorf(codes.FailedPrecondition, "volume %s is not attached to node %s (ControllerPublishVolume first)", req.GetVolumeId(), n.nodeID)
		}
	}
	// An encrypted volume is unlocked only by its key (the PV's nodePublishSecretRef); without it
	// nothing is mounted. The driver has no NodeStageVolume, so this is the only node-side check.
	if err := publishKeyError(h.ID, checkKey(meta, req.GetSecrets())); err != nil {
		return err
	}
	flagRO, err := n.profile.readOnlyFromFlags(req.GetVolumeCapability().GetMount().GetMountFlags())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	readOnly := req.GetReadonly() || flagRO

	if m, ok, err := mountAt(target); err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if ok {
		if m.readOnly != readOnly {
			record.MountedRO = m.readOnly
			return status.Errorf(codes.AlreadyExists, "%s is already published with readonly=%t", target, m.readOnly)
		}
		record.MountedRO = readOnly
		return nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return status.Errorf(codes.Internal, "creating target %s: %v", target, err)
	}
	source, err := n.profile.exportDir(n.store.volumeDir(h.ID), req.GetVolumeContext()[ctxPodNamespace])
	if err != nil {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	if source != n.store.volumeDir(h.ID) {
		// A tenant's export is created on its first publish, as fresh as a new volume's.
		if err := n.store.ensureExport(source); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return status.Errorf(codes.Internal, "bind mount %s -> %s: %v", source, target, err)
	}
	if readOnly {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(target, 0)
			return status.Errorf(codes.Internal, "read-only remount of %s: %v", target, err)
		}
	}
	record.MountedRO = readOnly
	return nil
}

func (n *Node) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if target == "" || !filepath.IsAbs(target) {
		return nil, status.Errorf(codes.InvalidArgument, "target path %q must be absolute", target)
	}
	for {
		_, ok, err := mountAt(target)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !ok {
			break
		}
		if err := unix.Unmount(target, 0); err != nil {
			return nil, status.Errorf(codes.Internal, "unmounting %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

type mountInfo struct {
	readOnly bool
}

// mountAt reads /proc/self/mountinfo for a mount whose mount point is path (the last one wins,
// as the kernel shows stacked mounts in order).
func mountAt(path string) (mountInfo, bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return mountInfo{}, false, fmt.Errorf("reading the mount table: %w", err)
	}
	defer f.Close()
	var found mountInfo
	ok := false
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) < 6 {
			continue
		}
		if unescapeMountPath(fields[4]) != path {
			continue
		}
		ok = true
		found = mountInfo{readOnly: hasOption(fields[5], "ro")}
	}
	if err := scanner.Err(); err != nil {
		return mountInfo{}, false, fmt.Errorf("reading the mount table: %w", err)
	}
	return found, ok, nil
}

func hasOption(options, want string) bool {
	for _, o := range strings.Split(options, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// unescapeMountPath undoes the kernel's octal escapes (\040 for a space and so on).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
