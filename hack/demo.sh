#!/usr/bin/env bash
# The demo (README command one): warmcache doing its main job on this machine.
#
#   hack/demo.sh          build what it needs (cached), start a one-node cluster on loopback with
#                         the real node, helm install the chart, apply examples/ (an unmodified
#                         vLLM-style Deployment in three namespaces, two of them one sharing
#                         domain, and a KVCacheBackend of the real Mooncake store), print what
#                         happened, and leave it all running
#   hack/demo.sh --down   stop everything the demo started (by its PID)
#
# Needs root (the real node runs containerd, runc and the kubelet, and mounts volumes), Go 1.26
# and Rust 1.95; missing Debian packages of the node are installed. The first run builds the
# control plane, the node, the Helm CLI and the hf client (about 40 minutes on 2 cores, cached
# under ${WARMCACHE_CACHE_DIR:-~/.cache/warmcache}); later runs take about 3 minutes.
# The demo's state (PID, log, kubeconfig, summary) is in that cache directory's demo/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cache=${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}
state=$cache/demo
pidfile=$state/demo.pid
log=$state/demo.log

running() {
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

case "${1:-}" in
  --down)
    if ! running; then
      echo "hack/demo.sh: the demo is not running"
      rm -f "$pidfile"
      exit 0
    fi
    pid=$(cat "$pidfile")
    echo "hack/demo.sh: stopping the demo (PID $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 120); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "hack/demo.sh: PID $pid did not stop within 120 s; its log: $log" >&2
      exit 1
    fi
    rm -f "$pidfile"
    echo "hack/demo.sh: stopped (the cluster, the node and their directories are gone)"
    exit 0
    ;;
  "") ;;
  -h|--help)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: hack/demo.sh [--down]" >&2
    exit 2
    ;;
esac

if running; then
  echo "hack/demo.sh: the demo is already running (PID $(cat "$pidfile")); hack/demo.sh --down stops it"
  [ -f "$state/summary.txt" ] && cat "$state/summary.txt"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "hack/demo.sh: needs root: the real node runs containerd and the kubelet and mounts volumes" >&2
  exit 1
fi
for tool in cargo go python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "hack/demo.sh: $tool is required and not on PATH" >&2; exit 1; }
done

echo "==> the control plane (etcd, kube-apiserver, kube-controller-manager; built once, cached)"
WARMCACHE_CONTROL_PLANE_BIN=$(hack/build-control-plane.sh | tail -n 1)
export WARMCACHE_CONTROL_PLANE_BIN
echo "==> the node (Debian containerd, runc, CNI loopback, busybox-static; kubelet, scheduler, CSI test driver)"
WARMCACHE_NODE_BIN=$(hack/build-node.sh --install-packages | tail -n 1)
export WARMCACHE_NODE_BIN
echo "==> the hf client (PyPI huggingface_hub, in a cached venv)"
WARMCACHE_MODEL_CLIENTS=$(hack/model-clients.sh | tail -n 1)
export WARMCACHE_MODEL_CLIENTS
echo "==> the Mooncake store (PyPI mooncake-transfer-engine-non-cuda, in a cached venv)"
if [ -z "${WARMCACHE_MOONCAKE_MASTER:-}" ] || [ ! -x "$WARMCACHE_MOONCAKE_MASTER" ]; then
  WARMCACHE_MOONCAKE_MASTER=$(hack/mooncake.sh | tail -n 1)
fi
export WARMCACHE_MOONCAKE_MASTER
echo "==> the Helm CLI (helm.sh/helm/v4, cached)"
WARMCACHE_HELM=$(hack/build-helm.sh | tail -n 1)
export WARMCACHE_HELM
echo "==> the component binaries and the demo (cargo build)"
cargo build --locked \
  -p warmcache-webhook -p warmcache-binding-controller -p warmcache-kvcache-operator \
  -p warmcache-uninstall-hook -p warmcache-reaper -p warmcache-model-volume-controller \
  --bins
cargo build --locked -p warmcache-e2e --bin demo
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug

mkdir -p "$state"
rm -f "$state/summary.txt"
: >"$log"
echo "==> the demo (log: $log)"
nohup "$bin/demo" --state-dir "$state" >"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"

# Follow the log until the demo is ready or has stopped.
shown=0
while :; do
  lines=$(wc -l <"$log")
  if [ "$lines" -gt "$shown" ]; then
    sed -n "$((shown + 1)),${lines}p" "$log" | grep -E '^(demo:|=== |namespace |ModelCacheBindings|KVCacheBackend|  |the Hub|Look around)' || true
    shown=$lines
  fi
  if grep -q '^demo: ready' "$log"; then
    echo "hack/demo.sh: running as PID $pid; hack/demo.sh --down stops it"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    rm -f "$pidfile"
    echo "hack/demo.sh: the demo stopped before it was ready; the end of its log ($log):" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
  sleep 2
done
