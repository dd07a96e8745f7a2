#!/usr/bin/env bash
# Builds the real Helm CLI (helm.sh/helm/v4, pinned in hack/helm/go.mod) that the chart tests run,
# and caches it outside the repository.
#
# Output: prints the path of the helm binary on its last line of stdout.
# Cache:  ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/helm/<stamp>/helm, where <stamp> hashes
#         the module files, this script and the Go version.
#
# A cold build takes about 3 minutes on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src="$here/helm"
cache_root="${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/helm"

command -v go >/dev/null 2>&1 || { echo "build-helm: the Go toolchain is required (go not on PATH)" >&2; exit 1; }

go_version=$(go env GOVERSION)
stamp=$( { echo "$go_version"; cat "$src/go.mod" "$src/go.sum" "$src/tools.go" "$0"; } | sha256sum | cut -c1-16)
out="$cache_root/$stamp"

if [ -x "$out/helm" ]; then
  echo "$out/helm"
  exit 0
fi

mkdir -p "$out"
# One builder at a time per cache entry: a second caller waits, then finds the binary.
exec 9>"$out/.lock"
flock 9
if [ -x "$out/helm" ]; then
  echo "$out/helm"
  exit 0
fi
version=$(awk '$1=="require" && $2=="helm.sh/helm/v4" {print $3}' "$src/go.mod")
echo "build-helm: building helm $version into $out" >&2
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
(cd "$src" && go build -trimpath -tags tools \
   -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
   -o "$out/helm.tmp" helm.sh/helm/v4/cmd/helm && mv "$out/helm.tmp" "$out/helm")
echo "$out/helm"
