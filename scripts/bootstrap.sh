#!/usr/bin/env bash
# Create .venv and install the pinned dependencies; explain in one line what is missing when it cannot.
set -euo pipefail
cd "${0%/*}/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY="$candidate"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "trainyard: Python 3.11 is required (python3.11 not found): install it, or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  echo "trainyard: no C compiler found (cc/gcc): install one (e.g. 'apt-get install build-essential') so packages without a wheel can build" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || { echo "trainyard: could not create .venv: install the venv module (e.g. 'apt-get install python3.11-venv')" >&2; exit 1; }
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt; then
  echo "trainyard: installing requirements-dev.txt (the runtime and the development tools) failed (output above): check network access to the package index" >&2
  exit 1
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e . >/dev/null 2>&1 || { echo "trainyard: installing the project itself failed: run .venv/bin/pip install -e . to see why" >&2; exit 1; }
# Debian's sandbox, build, registry and browser packages: installed as root, named otherwise.
scripts/system-packages.sh || exit 1
touch .venv/.installed
