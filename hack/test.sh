#!/usr/bin/env bash
# The one test command (README "Test"; CI's .ci/run runs exactly this).
#
# On a fresh machine it installs what the tests need first: the real Kubernetes control plane
# (built from pinned Go modules, cached under ~/.cache/warmcache), then runs the generated-file
# checks, formatting, lints and every test in the workspace. Integration tests start the control
# plane on loopback; they fail (never skip) when it cannot start.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "control plane binaries (etcd, kube-apiserver, kube-controller-manager)"
bin_dir=$(hack/build-control-plane.sh | tail -n 1)
export WARMCACHE_CONTROL_PLANE_BIN="$bin_dir"
echo "using $WARMCACHE_CONTROL_PLANE_BIN"

step "generated files are committed (cargo xtask crdgen --check)"
cargo xtask crdgen --check

step "dependency direction (cargo xtask deps-check)"
cargo xtask deps-check

step "formatting"
cargo fmt --all --check

step "lints"
cargo clippy --workspace --all-targets -- -D warnings

step "tests"
cargo test --workspace --no-fail-fast
