#!/usr/bin/env bash
# Starts a one-node local cluster in the foreground: the same control plane the integration
# tests use (etcd, kube-apiserver and kube-controller-manager on 127.0.0.1, with the CRDs from
# config/crd installed) and, by default, the real test node (kube-scheduler, containerd + runc,
# the kubelet as Node 127.0.0.1, and the TEST CSI driver's StorageClasses). Prints
# `export KUBECONFIG=...` and the path of the kubectl it built; stops everything on Ctrl-C.
#
#   hack/local-up.sh            control plane + real node (needs root; see docs/development.md)
#   hack/local-up.sh --no-node  control plane only (pods stay Pending)
#
# Binaries come from $WARMCACHE_CONTROL_PLANE_BIN / $WARMCACHE_NODE_BIN when set, else from
# hack/build-control-plane.sh and hack/build-node.sh (cached; the first builds take about 12
# and 15 minutes). As root, missing Debian packages of the node (containerd, runc, CNI
# loopback, busybox-static, iproute2) are installed first. The kubeconfig is written to
# ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/local/kubeconfig.
#
# The implementation is the `local-up` binary of pkg/testkit; arguments go to it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
with_node=1
for arg in "$@"; do
  [ "$arg" = --no-node ] && with_node=0
done
if [ "$with_node" = 1 ] && [ "$(id -u)" = 0 ]; then
  hack/build-node.sh --install-packages --packages-only
fi
exec cargo run --quiet --package warmcache-testkit --bin local-up -- "$@"
