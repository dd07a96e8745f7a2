#!/usr/bin/env bash
# Starts the same local control plane the integration tests use (etcd, kube-apiserver and
# kube-controller-manager on 127.0.0.1, with the CRDs from config/crd installed) in the
# foreground, prints `export KUBECONFIG=...`, and stops everything on Ctrl-C.
#
# Binaries come from $WARMCACHE_CONTROL_PLANE_BIN when set, else from hack/build-control-plane.sh
# (cached; the first build takes about 12 minutes). The kubeconfig is written to
# ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/local/kubeconfig.
#
# The implementation is the `local-up` binary of pkg/testkit; extra arguments go to cargo.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
exec cargo run --quiet --package warmcache-testkit --bin local-up "$@"
