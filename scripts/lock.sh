#!/usr/bin/env bash
# Re-pin both locks after editing requirements.in or requirements-dev.in: the runtime's whole tree into
# requirements.txt (what the production image installs), then what the development tools add into
# requirements-dev.txt (which starts with `-r requirements.txt`).
set -euo pipefail
cd "${0%/*}/.."
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
python3.11 -m venv "$d/venv"
pip="$d/venv/bin/pip"
"$pip" install -q --disable-pip-version-check -r requirements.in
{ echo "# The runtime's whole tree, pinned (requirements.in; \`make lock\`). The production image installs only this."
  "$pip" freeze --exclude-editable | LC_ALL=C sort -f; } > requirements.txt
"$pip" freeze --exclude-editable > "$d/runtime"
"$pip" install -q --disable-pip-version-check -r requirements-dev.in
{ echo "# Development and test tools, pinned (requirements-dev.in; \`make lock\`), on top of the runtime."
  echo "-r requirements.txt"
  "$pip" freeze --exclude-editable | grep -vxF -f "$d/runtime" | LC_ALL=C sort -f; } > requirements-dev.txt
