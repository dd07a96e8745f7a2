#!/usr/bin/env bash
# Installs the real Mooncake store for tests and prints where its programs are.
#
#   mooncake_master         the leader (the operator renders its flags: render::leader_args)
#   mc_store_rest_server    the member the operator renders (reads the rendered MOONCAKE_* env)
#   python (of the venv)    with mooncake.store (MooncakeDistributedStore), to put and get keys
#
# From PyPI `mooncake-transfer-engine-non-cuda` (pinned below: the version issue 15 measured) in a
# virtual environment cached outside the repository; the wheel's binaries link Debian's
# libibverbs1 and libnuma1, installed with apt-get when missing (root only).
#
# Output: the last line of stdout is the path of `mooncake_master`; the other programs live
#         beside it (the venv's bin directory), so `$(dirname "$(hack/mooncake.sh | tail -n 1)")`
#         is the directory to put on PATH.
# Cache:  ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/mooncake/<version>/venv; a complete cache
#         is marked by a stamp file written last, so an interrupted install is redone, not used.
#         A cached run starts no pip and no apt-get (well under a second).
#
# Flags: --check  exits 0 when the cache is complete (prints the path), 1 otherwise; installs
#                 nothing.
set -euo pipefail

version=0.3.13.post1
package=mooncake-transfer-engine-non-cuda
# Its Python dependencies (mc_store_rest_server's aiohttp and what that pulls), pinned to the set
# this script was written against, so a new release of one of them cannot change the member.
constraints='aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
frozenlist==1.8.0
idna==3.20
msgpack==1.2.4
multidict==7.2.1
propcache==0.5.4
requests==2.34.2
typing_extensions==4.16.0
urllib3==2.8.0
yarl==1.25.1'
cache_root="${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/mooncake"
dir="$cache_root/$version"
venv="$dir/venv"
stamp="$dir/complete"
master="$venv/bin/mooncake_master"

usage="usage: hack/mooncake.sh [--check]"
check_only=false
case "${1:-}" in
  "") ;;
  --check) check_only=true; shift ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
[ $# -eq 0 ] || { echo "$usage" >&2; exit 2; }

# Shared libraries the wheel's programs need from the system (library -> Debian package).
libraries=(libibverbs.so.1:libibverbs1 libnuma.so.1:libnuma1)

missing_packages() {
  local entry lib pkg
  for entry in "${libraries[@]}"; do
    lib=${entry%%:*}; pkg=${entry#*:}
    ldconfig -p 2>/dev/null | grep -q "[[:space:]]$lib " || echo "$pkg"
  done
}

ready() {
  [ -f "$stamp" ] && [ -x "$master" ] && [ -z "$(missing_packages)" ] \
    && [ "$(cat "$stamp")" = "$(printf '%s==%s\n%s' "$package" "$version" "$constraints")" ]
}

if ready; then
  echo "$master"
  exit 0
fi
if $check_only; then
  echo "mooncake: not installed (or incomplete) under $dir" >&2
  exit 1
fi

mapfile -t missing < <(missing_packages)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "mooncake: missing Debian packages ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "mooncake: installing ${missing[*]} (apt-get)" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

command -v python3 >/dev/null 2>&1 || { echo "mooncake: python3 is required (not on PATH)" >&2; exit 1; }
python3 -c 'import ensurepip, venv' 2>/dev/null \
  || { echo "mooncake: $(command -v python3) cannot create a virtual environment (no ensurepip/venv; on Debian's python3: apt-get install python3-venv)" >&2; exit 1; }
mkdir -p "$cache_root"
# One installer at a time: test binaries running in parallel may all call this script.
exec 9>"$cache_root/.lock"
flock 9
if ready; then
  echo "$master"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
echo "mooncake: installing $package==$version into $venv" >&2
python3 -m venv "$venv" >&2
printf '%s\n' "$constraints" >"$dir/constraints.txt"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  --constraint "$dir/constraints.txt" "$package==$version" >&2
[ -x "$master" ] || { echo "mooncake: $package $version installed no mooncake_master in $venv/bin" >&2; exit 1; }
# The programs must load (their libraries resolve) before the cache counts. The venv's
# mooncake_master is a Python launcher that execs the packaged binary (keeping its process id).
binary=$("$venv/bin/python" -c 'import mooncake, os; print(os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master"))')
if ldd "$binary" | grep -q 'not found'; then
  echo "mooncake: $binary cannot load its libraries:" >&2
  ldd "$binary" | grep 'not found' >&2
  exit 1
fi
"$venv/bin/python" -c 'import aiohttp, mooncake.store' >&2 \
  || { echo "mooncake: the venv's python cannot import mooncake.store and aiohttp (mc_store_rest_server)" >&2; exit 1; }
{ printf '%s==%s\n' "$package" "$version"; printf '%s\n' "$constraints"; } >"$stamp"
echo "$master"
