package main

import (
	"context"
	"crypto/subtle"
	"fmt"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Parameters the external-provisioner adds with --extra-create-metadata.
const (
	paramPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	reservedPrefix    = "csi.storage.k8s.io/"
	defaultCapacity   = int64(1 << 30)
)

// Controller is the CSI Controller service: volumes are directories; attachments (profiles
// with Attach) are records with the one-read-write-attachment rule.
type Controller struct {
	csi.UnimplementedControllerServer
	profile Profile
	nodeID  string
	store   *Store
}

func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	kinds := []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}
	if c.profile.Attach {
		kinds = append(kinds,
			csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
			csi.ControllerServiceCapability_RPC_PUBLISH_READONLY)
	}
	caps := make([]*csi.ControllerServiceCapability, 0, len(kinds))
	for _, k := range kinds {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: k}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (c *Controller) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	id := req.GetName()
	if !volumeIDPattern.MatchString(id) {
		return nil, status.Errorf(codes.InvalidArgument, "volume name %q: expected a lowercase DNS-style name (the external-provisioner's pvc-<uid>)", id)
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	modes := make([]string, 0, len(req.GetVolumeCapabilities()))
	for _, vc := range req.GetVolumeCapabilities() {
		if err := c.profile.checkCapability(vc); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		modes = append(modes, vc.GetAccessMode().GetMode().String())
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume content sources (snapshots, clones) are not supported by this test driver")
	}
	for k := range req.GetParameters() {
		if !strings.HasPrefix(k, reservedPrefix) {
			return nil, status.Errorf(codes.InvalidArgument, "StorageClass parameter %q is not known to this test driver (profile %s takes none)", k, c.profile.Name)
		}
	}
	namespace := ""
	if c.profile.NamespacedHandle {
		namespace = req.GetParameters()[paramPVCNamespace]
		if !namespacePattern.MatchString(namespace) {
			return nil, status.Errorf(codes.InvalidArgument, "profile %s needs the claim's namespace in parameter %s (run the external-provisioner with --extra-create-metadata); got %q", c.profile.Name, paramPVCNamespace, namespace)
		}
	}
	capacity := req.GetCapacityRange().GetRequiredBytes()
	if capacity <= 0 {
		capacity = defaultCapacity
	}
	if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && capacity > limit {
		return nil, status.Errorf(codes.OutOfRange, "required %d bytes exceeds the limit %d", capacity, limit)
	}
	handle := c.profile.handleFor(id, namespace)
	digest, err := c.profile.createKeyDigest(req.GetSecrets())
	if err != nil {
		return nil, err
	}

	c.store.mu.Lock()
	defer c.store.mu.Unlock()
	existing, err := c.store.readMeta(id)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if existing != nil {
		// Idempotent retry of the same request; anything else under this name is a conflict.
		if existing.CapacityBytes != capacity || existing.Handle != handle {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with handle %s and %d bytes", id, existing.Handle, existing.CapacityBytes)
		}
		if subtle.ConstantTimeCompare([]byte(existing.KeySHA256), []byte(digest)) != 1 {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with incompatible parameters: %s", id, encryptionMismatch(existing.KeySHA256, digest))
		}
	} else {
		meta := VolumeMeta{ID: id, Name: id, Handle: handle, CapacityBytes: capacity, Modes: modes, Created: time.Now().UTC(), KeySHA256: digest}
		if err := c.store.createVolume(meta); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      handle,
		CapacityBytes: capacity,
		VolumeContext: map[string]string{"testDriverProfile": c.profile.Name},
	}}, nil
}

func (c *Controller) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	h, err := c.profile.parseHandle(req.GetVolumeId())
	if err != nil {
		// Not a handle this driver could have created: nothing to delete.
		return &csi.DeleteVolumeResponse{}, nil
	}
	c.store.mu.Lock()
	defer c.store.mu.Unlock()
	meta, err := c.store.readMeta(h.ID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	// An encrypted volume is deleted only with its key; an absent one (deleted already) is not
	// checked, so a retried DeleteVolume stays a success.
	if err := deleteKeyError(h.ID, checkKey(meta, req.GetSecrets())); err != nil {
		return nil, err
	}
	attachments, err := c.store.readAttachments()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	for _, a := range attachments {
		if a.ID == h.ID {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still attached to node %s (handle %s)", h.ID, a.NodeID, a.Handle)
		}
	}
	if err := c.store.deleteVolume(h.ID); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (c *Controller) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	h, err := c.profile.parseHandle(req.GetVolumeId())
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	meta, err := c.store.readMeta(h.ID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if meta == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", h.ID)
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if err := c.profile.checkCapability(vc); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func (c *Controller) ControllerPublishVolume(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if !c.profile.Attach {
		return nil, status.Errorf(codes.Unimplemented, "profile %s has no attach (the CSIDriver must say attachRequired: false)", c.profile.Name)
	}
	h, err := c.profile.parseHandle(req.GetVolumeId())
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if req.GetNodeId() != c.nodeID {
		return nil, status.Errorf(codes.NotFound, "node %q is not known to this driver (it serves node %q)", req.GetNodeId(), c.nodeID)
	}
	if err := c.profile.checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	c.store.mu.Lock()
	defer c.store.mu.Unlock()
	meta, err := c.store.readMeta(h.ID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if meta == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", h.ID)
	}
	attachments, err := c.store.readAttachments()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	want := Attachment{Handle: req.GetVolumeId(), ID: h.ID, NodeID: req.GetNodeId(), ReadOnly: req.GetReadonly()}
	already, err := decideAttach(attachments, want)
	if err != nil {
		return nil, err
	}
	if !already {
		if err := c.store.writeAttachments(append(attachments, want)); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"readOnly": fmt.Sprint(want.ReadOnly)}}, nil
}

// decideAttach applies the one-read-write-attachment rule of the block profile (NVMesh refuses a
// read-only attach while the volume is attached read-write anywhere, even by a finished pod):
// a read-write attachment excludes every other attachment of the same volume, whatever its
// handle (a reader PV's rewritten handle names the same volume) or node. It reports whether the
// very same attachment exists already (an idempotent retry), and refuses a retry that changes
// only the read-only flag, as the CSI spec asks.
func decideAttach(list []Attachment, want Attachment) (bool, error) {
	for _, a := range list {
		if a.ID != want.ID {
			continue
		}
		if a.Handle == want.Handle && a.NodeID == want.NodeID {
			if a.ReadOnly == want.ReadOnly {
				return true, nil
			}
			return false, status.Errorf(codes.AlreadyExists, "volume %s is already attached to node %s with readonly=%t", want.Handle, want.NodeID, a.ReadOnly)
		}
		if !a.ReadOnly {
			return false, status.Errorf(codes.FailedPrecondition,
				"volume %s is attached read-write (handle %s, node %s): one read-write attachment at a time, so an attach of handle %s (readonly=%t) is refused until it is detached",
				want.ID, a.Handle, a.NodeID, want.Handle, want.ReadOnly)
		}
		if !want.ReadOnly {
			return false, status.Errorf(codes.FailedPrecondition,
				"volume %s is attached read-only (handle %s, node %s): a read-write attach of handle %s is refused while any other attachment exists",
				want.ID, a.Handle, a.NodeID, want.Handle)
		}
	}
	return false, nil
}

func (c *Controller) ControllerUnpublishVolume(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if !c.profile.Attach {
		return nil, status.Errorf(codes.Unimplemented, "profile %s has no attach", c.profile.Name)
	}
	c.store.mu.Lock()
	defer c.store.mu.Unlock()
	attachments, err := c.store.readAttachments()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	kept := attachments[:0]
	for _, a := range attachments {
		if a.Handle == req.GetVolumeId() && (req.GetNodeId() == "" || a.NodeID == req.GetNodeId()) {
			continue
		}
		kept = append(kept, a)
	}
	if err := c.store.writeAttachments(kept); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
