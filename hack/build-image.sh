#!/usr/bin/env bash
# Builds the warmcache image: the component binaries (release profile) and the shared libraries
# they link, as an OCI image archive (one uncompressed layer, no base image, no shell; runs as
# uid 65532). No Docker engine is needed. Prints the archive's path on its last line.
#
#   hack/build-image.sh [REFERENCE]        # default warmcache.test/warmcache:<version>
#
# Push it to a registry, then install the chart with that image:
#   skopeo copy oci-archive:<archive> docker://registry.example/warmcache:0.1.0
#   helm install warmcache charts/warmcache -n warmcache-system --create-namespace \
#     --set image.repository=registry.example/warmcache --set image.tag=0.1.0
# The libraries come from this machine, so build on the oldest glibc the cluster's nodes should
# run (the image carries its own; the nodes' do not matter).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

profile=${WARMCACHE_IMAGE_PROFILE:-release}
target_dir=${CARGO_TARGET_DIR:-target}
profile_dir=$profile; [ "$profile" = dev ] && profile_dir=debug
out="$target_dir/images"
args=(--bin-dir "$target_dir/$profile_dir" --out "$out")
if [ $# -gt 0 ]; then args+=(--reference "$1"); fi

cargo build --locked --profile "$profile" -p warmcache-webhook -p warmcache-binding-controller \
  -p warmcache-kvcache-operator -p warmcache-uninstall-hook -p warmcache-reaper \
  -p warmcache-model-volume-controller --bins >&2
cargo run --locked -q -p warmcache-testkit --bin build-image -- "${args[@]}"
