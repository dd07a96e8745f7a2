#!/usr/bin/env bash
# Installs the real model download clients that tests run against the simulated model sources
# (test/sources) and prints where they are.
#
#   hf      the Hugging Face Hub CLI (PyPI huggingface_hub, pinned below), as charts call it
#           (`hf download <repo> [--revision R] [--local-dir D]`, HF_ENDPOINT for a mirror)
#
# Into a virtual environment cached outside the repository, with every dependency pinned, so a
# new release upstream cannot change what the tests exercise.
#
# Output: the last line of stdout is the venv's bin directory (holding `hf` and `python`).
# Cache:  ${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/model-clients/<stamp>/venv; a complete
#         cache is marked by a stamp file written last, so an interrupted install is redone. A
#         cached run starts no pip (well under a second).
set -euo pipefail

requirements='huggingface_hub==2.4.0
anyio==4.16.0
click==8.5.1
filelock==4.3.2
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpx2==2.16.2
idna==3.20
packaging==26.4
PyYAML==6.0.4
tqdm==4.70.1
truststore==0.10.5
typing_extensions==4.16.0'
key=$(printf '%s' "$requirements" | sha256sum | cut -c1-16)
cache_root="${WARMCACHE_CACHE_DIR:-$HOME/.cache/warmcache}/model-clients"
dir="$cache_root/$key"
venv="$dir/venv"
stamp="$dir/complete"

[ $# -eq 0 ] || { echo "usage: hack/model-clients.sh" >&2; exit 2; }

if [ -f "$stamp" ] && [ -x "$venv/bin/hf" ]; then
  echo "$venv/bin"
  exit 0
fi
command -v python3 >/dev/null 2>&1 || { echo "model-clients: python3 is required (not on PATH)" >&2; exit 1; }
python3 -c 'import ensurepip, venv' 2>/dev/null \
  || { echo "model-clients: $(command -v python3) cannot create a virtual environment (on Debian: apt-get install python3-venv)" >&2; exit 1; }
mkdir -p "$cache_root"
# One installer at a time: test binaries running in parallel may all call this script.
exec 9>"$cache_root/.lock"
flock 9
if [ -f "$stamp" ] && [ -x "$venv/bin/hf" ]; then
  echo "$venv/bin"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
echo "model-clients: installing huggingface_hub into $venv" >&2
python3 -m venv "$venv" >&2
printf '%s\n' "$requirements" >"$dir/requirements.txt"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  --no-deps --requirement "$dir/requirements.txt" >&2
"$venv/bin/hf" version >&2 || { echo "model-clients: the installed hf does not run" >&2; exit 1; }
printf '%s\n' "$requirements" >"$stamp"
echo "$venv/bin"
