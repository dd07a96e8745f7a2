#!/usr/bin/env bash
# Builds the kube-apiserver of the oldest Kubernetes version the chart supports (Chart.yaml's
# kubeVersion, ">=1.30.0-0": v1.30.14, pinned in hack/controlplane/kube-oldest/) and caches it
# outside the repository. The chart tests validate every rendered object against it as well as
# against the current control plane (hack/build-control-plane.sh); its etcd is the kit's.
#
# Output: prints the directory holding `kube-apiserver` on its last line of stdout.
# Cache:  ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/apiserver-oldest/<stamp>/bin, where
#         <stamp> hashes the module files and the Go version.
#
# A cold build takes about 6 minutes on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kube-ldflags.sh
. "$here/lib/kube-ldflags.sh"
src="$here/controlplane/kube-oldest"
cache_root="${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/apiserver-oldest"

command -v go >/dev/null 2>&1 || { echo "build-oldest-apiserver: the Go toolchain is required (go not on PATH)" >&2; exit 1; }
go_version=$(go env GOVERSION)

stamp=$( { echo "$go_version"; cat "$src"/go.mod "$src"/go.sum "$src"/tools.go "$0" "$here/lib/kube-ldflags.sh"; } | sha256sum | cut -c1-16)
out="$cache_root/$stamp/bin"
if [ -x "$out/kube-apiserver" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
exec 9>"$cache_root/$stamp/.lock"
flock 9
if [ -x "$out/kube-apiserver" ]; then
  echo "$out"
  exit 0
fi
kube_version=$(kube_version "$src/go.mod")
ldflags=$(kube_ldflags "$src/go.mod")
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
echo "build-oldest-apiserver: building kube-apiserver $kube_version into $out (slow on a cold cache)" >&2
(cd "$src" && go build -trimpath -tags tools -ldflags "$ldflags" -o "$out/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver \
   && mv "$out/kube-apiserver.tmp" "$out/kube-apiserver")
echo "$out"
