//go:build tools

// Package tools pins the sidecar command this module builds.
package tools

import _ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
