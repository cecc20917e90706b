"""The real control plane of `make cluster` for every test of this folder, and the session's RBAC checks on it:
every request of the platform's service account granted by `k8s/rbac.yaml`, and, when the whole real-cluster suite
ran and passed, every grant used by some request (both read from the API server's audit log)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.paths import BASE_DIR
from tests.test_k8s_manifests import RBAC_GROUP, granted

HERE = Path(__file__).resolve().parent
# Where `scripts/cluster/cluster.py` keeps the running cluster (a second pair run beside the first has its own).
CLUSTER_DIR = Path(os.environ.get("TRAINYARD_CLUSTER_DIR") or BASE_DIR / "var" / "cluster")
COLLECTED = pytest.StashKey[set[str]]()
PLATFORM_USER = "system:serviceaccount:trainyard:"
# No metrics-server runs in `make cluster`: its API's grant is used on the fake API server only
# (tests/test_fake_k8s_metrics.py, jobs/tests/test_pod_metrics.py).
NOT_SERVED_HERE = frozenset({"metrics.k8s.io"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Runs before `-k` and `-m` deselect anything: the real-cluster tests collected."""
    config.stash[COLLECTED] = {item.nodeid for item in items if Path(str(item.path)).parent == HERE}


def whole_suite_selected(session) -> bool:
    """Every test of every tests/k8s/test_*.py file was collected and none of them deselected."""
    collected = session.config.stash.get(COLLECTED, set())
    selected = {item.nodeid for item in session.items if Path(str(item.path)).parent == HERE}
    files = {Path(str(item.path)).name for item in session.items if Path(str(item.path)).parent == HERE}
    return bool(collected) and collected <= selected and files == {p.name for p in HERE.glob("test_*.py")}


@pytest.fixture(scope="session")
def real_cluster(request):
    """The control plane of `make cluster`, started when it is not running (and stopped again after the session
    when this fixture started it). At the end: every request of the platform's service account was granted, and
    when the whole real-cluster suite ran and passed, every grant was used."""
    script = BASE_DIR / "scripts" / "cluster" / "cluster.py"
    running = subprocess.run([sys.executable, str(script), "status"], cwd=BASE_DIR, capture_output=True, text=True)
    started = running.returncode != 0
    if started:
        up = subprocess.run(
            [sys.executable, str(script), "up"], cwd=BASE_DIR, capture_output=True, text=True, timeout=3600
        )
        if up.returncode != 0:
            said = f"the real control plane (make cluster) did not start:\n{(up.stdout + up.stderr)[-3000:]}"
            if os.environ.get("CI") == "true":
                pytest.fail(said)
            pytest.skip(said)
    state = json.loads((CLUSTER_DIR / "state.json").read_text())
    audit = Path(state["dir"]) / "audit" / "audit.log"
    begun = audit.stat().st_size if audit.exists() else 0
    yield state
    events = platform_requests(audit, begun)
    if started:
        subprocess.run([sys.executable, str(script), "down"], cwd=BASE_DIR, capture_output=True, timeout=120)
    refused = rbac_refusals(events)
    # Every verb the platform used in the session was granted by k8s/rbac.yaml, even where it coped with a refusal.
    assert not refused, f"the API server refused the platform's service account (k8s/rbac.yaml): {refused[:10]}"
    if whole_suite_selected(request.session) and request.session.testsfailed == 0:
        unused = rbac_unused(events)
        assert not unused, f"k8s/rbac.yaml grants what no request of the whole real-cluster suite used: {unused}"


def platform_requests(audit: Path, offset: int = 0) -> list[dict]:
    """The audit events of the platform's service account, from the API server's audit log after `offset` bytes
    (from the start when the log was rotated since)."""
    if not audit.exists():
        return []
    with audit.open("rb") as stream:
        stream.seek(offset if audit.stat().st_size >= offset else 0)
        lines = stream.read().decode().splitlines()
    events = (json.loads(line) for line in lines if line.strip())
    return [e for e in events if e.get("user", {}).get("username", "").startswith(PLATFORM_USER)]


def rbac_refusals(events: list[dict]) -> list[tuple[str, str, str]]:
    """(verb, resource, namespace) of each request that the API server's authorizer refused."""
    refused = []
    for event in events:
        if (event.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid":
            ref = event.get("objectRef") or {}
            resource = "/".join(filter(None, (ref.get("apiGroup"), ref.get("resource"), ref.get("subresource"))))
            refused.append((event.get("verb", ""), resource, ref.get("namespace", "")))
    return refused


def rbac_unused(events: list[dict]) -> list[tuple[str, str, str, str]]:
    """What `k8s/rbac.yaml` grants (scope, apiGroup, resource, verb) that no allowed request of `events` needed.
    A namespaced request that a cluster-wide grant covers counts as that grant (team namespaces are made at run
    time); creating or replacing a RoleBinding also needs `bind` on the ClusterRole it names."""
    grants = granted()
    used = set()
    for event in events:
        ref = event.get("objectRef")
        if not ref or (event.get("annotations") or {}).get("authorization.k8s.io/decision") != "allow":
            continue
        group = ref.get("apiGroup", "")
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        verb, scope = event["verb"], ref.get("namespace") or "cluster"
        if (scope, group, resource, verb) not in grants and ("cluster", group, resource, verb) in grants:
            scope = "cluster"
        used.add((scope, group, resource, verb))
        if group == RBAC_GROUP and resource == "rolebindings" and verb in ("create", "update"):
            used.add(("cluster", RBAC_GROUP, "clusterroles", "bind"))
    return sorted(g for g in grants - used if g[1] not in NOT_SERVED_HERE)
