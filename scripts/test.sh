#!/usr/bin/env bash
# `make test`: the bulk of the suite in parallel pytest-xdist workers (each with its own PostgreSQL and Redis
# databases), then the fault suite and the browser tests on their own: they time real processes, real outages
# and a real browser, and two of them at once on a small machine would measure each other; then the real-cluster
# tests in a pytest process of their own.
# -rsfE: the skip reasons, then every failure and error, listed last so the end of a long log names them.
# Arguments go to every run (`make test PYTEST_ARGS=path`); a run that selects nothing (exit 5) is not a failure.
set -uo pipefail
cd "${0%/*}/.."
py=.venv/bin/python
workers="${TRAINYARD_TEST_WORKERS:-2}"
"$py" -m pytest -rsfE -n "$workers" --dist loadfile -m "not faults and not browser and not k8s" "$@"
bulk=$?
# The real control plane's binaries are built (cold: tens of minutes on 2 cores; cached by version) before the run
# whose per-test timeout would otherwise cut the build off inside the cluster fixture.
if [ $# -eq 0 ] || printf '%s\n' "$@" | grep -q k8s; then
  "$py" scripts/cluster/cluster.py build || { [ "${CI:-}" = true ] && exit 1; }
fi
"$py" -m pytest -rsfE -m "faults or browser" "$@"
alone=$?
# The real-cluster tests in a process of their own: the fault suite stops and swaps brokers and databases under the
# test process, and what a fault test leaves behind in it must not decide whether a cluster test's job is woken.
# TRAINYARD_TEST_K8S_ALSO=<kubernetes>/<volcano> (`.ci/run` names the oldest pair) runs them on that pair too, at
# the same time: a cluster of its own under var/cluster-<pair>, and lane 1 of ops/pytest_workers.py in the shared
# PostgreSQL, Redis and object store. Most of a real-cluster test is waiting on controllers (the suite leaves the
# two cores about 60% idle), so the two runs overlap where one after the other took 7 minutes each.
also="${TRAINYARD_TEST_K8S_ALSO:-}"
if [ -n "$also" ]; then
  case "$also" in
    v*/v*) ;;
    *) echo "test: TRAINYARD_TEST_K8S_ALSO must be <kubernetes>/<volcano>, e.g. v1.29.0/v1.10.0, not '$also'" >&2; exit 2 ;;
  esac
  also_env=(TRAINYARD_CLUSTER_KUBERNETES="${also%%/*}" TRAINYARD_CLUSTER_VOLCANO="${also#*/}"
            TRAINYARD_CLUSTER_DIR="$PWD/var/cluster-${also%%/*}-${also#*/}" TRAINYARD_TEST_LANE=1)
  env "${also_env[@]}" "$py" scripts/cluster/cluster.py build || exit 1
  also_log="$(mktemp "${TMPDIR:-/tmp}/trainyard-k8s-also.XXXXXX")"
  env "${also_env[@]}" "$py" -m pytest -rsfE -m k8s "$@" > "$also_log" 2>&1 &
  also_pid=$!
fi
"$py" -m pytest -rsfE -m k8s "$@"
cluster=$?
if [ -n "$also" ]; then
  wait "$also_pid"
  also_rc=$?
  echo "--- the real-cluster tests on Kubernetes ${also%%/*} with Volcano ${also#*/} (run at the same time):"
  cat "$also_log"
  rm -f "$also_log"
  [ "$also_rc" -eq 5 ] && also_rc=0
  [ "$cluster" -eq 5 ] && cluster=0
  [ "$cluster" -eq 0 ] && cluster=$also_rc
fi
[ "$bulk" -eq 5 ] && bulk=0
[ "$alone" -eq 5 ] && alone=0
[ "$cluster" -eq 5 ] && cluster=0
if [ "$bulk" -ne 0 ]; then exit "$bulk"; fi
if [ "$alone" -ne 0 ]; then exit "$alone"; fi
exit "$cluster"
