#!/usr/bin/env bash
# Builds the real Kubernetes control plane used by the tests (etcd, kube-apiserver,
# kube-controller-manager) from the pinned Go modules under hack/controlplane/, and
# caches the binaries outside the repository.
#
# Output: prints the directory holding the three binaries on its last line of stdout.
# Cache:  ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/controlplane/<stamp>/bin, where
#         <stamp> hashes the module files and the Go version, so the binaries are rebuilt
#         only when a pinned version (or the Go toolchain) changes.
#
# A cold build takes about 12 minutes and 2.5 GB of memory on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kube-ldflags.sh
. "$here/lib/kube-ldflags.sh"
src="$here/controlplane"
cache_root="${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/controlplane"

command -v go >/dev/null 2>&1 || { echo "build-control-plane: the Go toolchain is required (go not on PATH)" >&2; exit 1; }

go_version=$(go env GOVERSION)
case "$go_version" in
  go1.26*) ;;
  *) echo "build-control-plane: Kubernetes 1.36 must be built with Go 1.26 (found $go_version)" >&2; exit 1 ;;
esac

stamp=$( { echo "$go_version"; cat "$src"/kube/go.mod "$src"/kube/go.sum "$src"/kube/tools.go \
             "$src"/etcd/go.mod "$src"/etcd/go.sum "$src"/etcd/main.go "$0" "$here/lib/kube-ldflags.sh"; } | sha256sum | cut -c1-16)
out="$cache_root/$stamp/bin"

if [ -x "$out/etcd" ] && [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
# One builder at a time per cache entry: a second caller waits, then finds the binaries.
exec 9>"$cache_root/$stamp/.lock"
flock 9
if [ -x "$out/etcd" ] && [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ]; then
  echo "$out"
  exit 0
fi
kube_version=$(kube_version "$src/kube/go.mod")
ldflags=$(kube_ldflags "$src/kube/go.mod")

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
echo "build-control-plane: building etcd into $out" >&2
(cd "$src/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" . && mv "$out/etcd.tmp" "$out/etcd")
for cmd in kube-apiserver kube-controller-manager; do
  echo "build-control-plane: building $cmd $kube_version into $out (slow on a cold cache)" >&2
  (cd "$src/kube" && go build -trimpath -tags tools -ldflags "$ldflags" -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd" \
     && mv "$out/$cmd.tmp" "$out/$cmd")
done
echo "$out"
