#!/usr/bin/env bash
# The Debian packages the platform runs with, installed when missing (idempotent; run by bootstrap.sh, so by both
# `make run` and `make test`):
#   bubblewrap, slirp4netns  the local job sandbox and its optional outbound network
#   podman, docker-registry  project image builds and the embedded OCI registry
#   uidmap                   newuidmap/newgidmap: builds run rootless as a user of their team (images/builder.py)
#   python3                  Debian's Python, what the offline base image python-local is assembled from
#   chromium, fonts-noto-cjk the portal's browser tests (Playwright drives Debian's Chromium; never a downloaded one)
#   iproute2                 `ip`: the build-network tests' package mirror on a test host of its own (a veth pair)
# As root it installs them with apt-get; as another user it prints the one command to run and carries on (so
# `make venv` and the tests that need none of them still work). `make run` does not start without the ones its
# configuration needs (bwrap, slirp4netns, podman, newuidmap/newgidmap, docker-registry while no registry is
# configured): it stops before "ready" naming the apt-get line (ops/health.py missing_tools), and /readyz fails
# while one is missing. Set TRAINYARD_SYSTEM_PACKAGES=off to skip this script (a machine managed some other way).
set -uo pipefail
[ "${TRAINYARD_SYSTEM_PACKAGES:-on}" = off ] && exit 0
declare -A provides=(
  [bubblewrap]=/usr/bin/bwrap
  [slirp4netns]=/usr/bin/slirp4netns
  [podman]=/usr/bin/podman
  [uidmap]=/usr/bin/newuidmap
  [docker-registry]=/usr/bin/docker-registry
  [python3]=/usr/bin/python3
  [chromium]=/usr/bin/chromium
  [fonts-noto-cjk]=/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc
  [iproute2]=/usr/sbin/ip
)
missing=()
for pkg in bubblewrap slirp4netns podman uidmap docker-registry python3 chromium fonts-noto-cjk iproute2; do
  [ -e "${provides[$pkg]}" ] || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "trainyard: missing system packages (${missing[*]}) and no apt-get here: install their equivalents" >&2
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "trainyard: missing system packages: run 'sudo apt-get install -y ${missing[*]}'" >&2
  exit 0
fi
echo "trainyard: installing system packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
  echo "trainyard: apt-get could not install ${missing[*]} (output above)" >&2
  exit 1
fi
