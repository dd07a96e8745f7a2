#!/usr/bin/env bash
# Builds the binaries of the real test node (pkg/testkit's RealNode) and caches them outside the
# repository, like hack/build-control-plane.sh does for the control plane:
#
#   kubelet, kube-scheduler, kubectl  k8s.io/kubernetes/cmd/* from the same pinned module as the
#                                     control plane (hack/controlplane/kube), same ldflags
#   csi-test-driver, pause            our own Go programs (hack/node): the TEST CSI driver and the
#                                     pod sandbox process
#   csi-provisioner                   github.com/kubernetes-csi/external-provisioner/v6 (wrapper
#                                     module hack/node/sidecars/provisioner)
#   csi-attacher                      github.com/kubernetes-csi/external-attacher/v4 (wrapper
#                                     module hack/node/sidecars/attacher), for the block profile
#
# Output: prints the directory holding the binaries on its last line of stdout.
# Cache:  ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/node/<stamp>/bin, where <stamp> hashes
#         every module file and Go source this script builds from, the script and the Go version.
#
# Costs on 2 cores (docs/development.md, "The real node"): about 2 minutes for the Kubernetes
# commands once the control plane was built (shared Go build cache), about 15 more for the two
# sidecars cold; returns at once when cached.
#
# The node also needs, at run time, Debian's containerd, runc, containernetworking-plugins
# (loopback), busybox-static and iproute2: `hack/build-node.sh --install-packages` installs the
# missing ones with apt-get (root only) before building (`--packages-only`: and stops there).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/kube-ldflags.sh
. "$here/lib/kube-ldflags.sh"
kube_src="$here/controlplane/kube"
node_src="$here/node"
cache_root="${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/node"
binaries=(kubelet kube-scheduler kubectl csi-test-driver pause csi-provisioner csi-attacher)

# Debian packages the node runs (binary -> package).
packages=(containerd:containerd runc:runc /usr/lib/cni/loopback:containernetworking-plugins
          /bin/busybox:busybox-static ip:iproute2)

install_packages() {
  local missing=() entry bin pkg
  for entry in "${packages[@]}"; do
    bin=${entry%%:*}; pkg=${entry#*:}
    case $bin in
      /*) [ -x "$bin" ] || missing+=("$pkg") ;;
      *) command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg") ;;
    esac
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "build-node: missing Debian packages ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
    return 1
  fi
  echo "build-node: installing ${missing[*]} (apt-get)" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

usage="usage: hack/build-node.sh [--install-packages [--packages-only]]"
if [ "${1:-}" = "--install-packages" ]; then
  install_packages
  shift
  if [ "${1:-}" = "--packages-only" ]; then
    shift
    [ $# -eq 0 ] || { echo "$usage" >&2; exit 2; }
    exit 0
  fi
fi
[ $# -eq 0 ] || { echo "$usage" >&2; exit 2; }

command -v go >/dev/null 2>&1 || { echo "build-node: the Go toolchain is required (go not on PATH)" >&2; exit 1; }
go_version=$(go env GOVERSION)
case "$go_version" in
  go1.26*) ;;
  *) echo "build-node: Kubernetes 1.36 must be built with Go 1.26 (found $go_version)" >&2; exit 1 ;;
esac

stamp=$( { echo "$go_version"; cat "$kube_src"/go.mod "$kube_src"/go.sum "$kube_src"/tools.go "$0" "$here/lib/kube-ldflags.sh"
           find "$node_src" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort \
             | while read -r f; do echo "$f" | sed "s#^$node_src/##"; cat "$f"; done
         } | sha256sum | cut -c1-16)
out="$cache_root/$stamp/bin"

complete() {
  local b
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
}

if complete; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
# One builder at a time per cache entry: a second caller waits, then finds the binaries.
exec 9>"$cache_root/$stamp/.lock"
flock 9
if complete; then
  echo "$out"
  exit 0
fi

ldflags=$(kube_ldflags "$kube_src/go.mod")

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
# build NAME DIR PACKAGE [go build flags...]: builds into $out/NAME atomically, timing it.
build() {
  local name=$1 dir=$2 pkg=$3 started
  shift 3
  [ -x "$out/$name" ] && return 0
  started=$(date +%s)
  echo "build-node: building $name into $out" >&2
  (cd "$dir" && go build -trimpath "$@" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  echo "build-node: $name built in $(( $(date +%s) - started ))s" >&2
}
build csi-test-driver "$node_src" ./csi-test-driver -ldflags "-s -w"
build pause "$node_src" ./pause -ldflags "-s -w"
for cmd in kube-scheduler kubelet kubectl; do
  build "$cmd" "$kube_src" "k8s.io/kubernetes/cmd/$cmd" -tags tools -ldflags "$ldflags"
done
build csi-provisioner "$node_src/sidecars/provisioner" \
  github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner -ldflags "-s -w"
build csi-attacher "$node_src/sidecars/attacher" \
  github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher -ldflags "-s -w"
echo "$out"
