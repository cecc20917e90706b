#!/usr/bin/env bash
# The platform installed as the Dockerfile installs it (a plain, non-editable `pip install .` into a folder of its
# own), run from outside the checkout with nothing of the checkout importable: the installed copy must hold
# everything the embedded smoke test needs (templates, translations, the CLI, every layer).
set -euo pipefail
cd "${0%/*}/.."
repo=$(pwd)
py="$repo/.venv/bin/python"
d=$(mktemp -d)
trap 'rm -rf "$d" "$repo/build"' EXIT  # setuptools builds in build/ of the checkout
"$py" -m pip install -q --disable-pip-version-check --no-deps --target "$d/site" . >"$d/pip.log" 2>&1 \
  || { cat "$d/pip.log"; echo "smoke-installed: pip install . failed" >&2; exit 1; }
cp tests/test_smoke_embedded.py "$d/"
cd "$d"
unset DATABASE_URL REDIS_URL TRAINYARD_S3_URL TRAINYARD_REGISTRY_URL
export PYTHONPATH="$d/site" DJANGO_SETTINGS_MODULE=trainyard.settings TRAINYARD_VAR_DIR="$d/var"
"$py" - "$d/site" <<'PY'
import sys

import jobs
import trainyard_cli

for module in (jobs, trainyard_cli):
    assert module.__file__.startswith(sys.argv[1]), f"{module.__name__} came from {module.__file__}, not the install"
print("smoke-installed: the platform comes from", sys.argv[1])
PY
"$py" -m ops.embedded exec -- "$py" -m pytest -q -p no:cacheprovider -p pytest_django --rootdir . -c /dev/null \
  test_smoke_embedded.py
