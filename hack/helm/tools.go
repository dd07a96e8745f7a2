//go:build tools

// Package tools pins the real Helm CLI the chart tests run (hack/build-helm.sh).
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
