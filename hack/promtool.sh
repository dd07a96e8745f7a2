#!/usr/bin/env bash
# Fetches promtool (Prometheus's `promtool check metrics`, the exposition linter) from Debian's
# `prometheus` package, pinned below, and prints its path. The package is downloaded and unpacked
# with dpkg -x, never installed: no Prometheus server is set up or started.
#
# Output: the last line of stdout is the promtool binary.
# Cache:  ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/promtool/<version>/usr/bin/promtool; a
#         complete cache is marked by a stamp file written last, so an interrupted fetch is redone.
#         A cached run runs no apt-get (well under a second).
set -euo pipefail

version='2.42.0+ds-5+deb12u1'
cache_root="${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/promtool"
dir="$cache_root/$version"
bin="$dir/usr/bin/promtool"
stamp="$dir/complete"

[ $# -eq 0 ] || { echo "usage: hack/promtool.sh" >&2; exit 2; }

if [ -f "$stamp" ] && [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 \
  || { echo "promtool: apt-get and dpkg are required (Debian's prometheus package provides promtool)" >&2; exit 1; }
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9
if [ -f "$stamp" ] && [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir/deb"
echo "promtool: fetching Debian prometheus=$version (apt-get download, unpacked with dpkg -x)" >&2
if ! (cd "$dir/deb" && apt-get download -qq "prometheus=$version" >&2); then
  # The package lists may be missing or old on a fresh machine.
  apt-get update -qq >&2
  if ! (cd "$dir/deb" && apt-get download -qq "prometheus=$version" >&2); then
    # A stable update replaced the pinned build: the linter's rules are the same within 2.42.
    echo "promtool: prometheus=$version is no longer served; taking Debian's current build" >&2
    (cd "$dir/deb" && apt-get download -qq prometheus >&2)
  fi
fi
dpkg -x "$dir"/deb/prometheus_*.deb "$dir"
rm -rf "$dir/deb"
"$bin" --version >/dev/null
touch "$stamp"
echo "$bin"
