//go:build tools

// Package tools pins the oldest Kubernetes API server the chart supports (kubeVersion
// ">=1.30.0-0"): hack/build-control-plane.sh --oldest builds it, and the chart tests validate
// every rendered object against it as well as against the current one.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
