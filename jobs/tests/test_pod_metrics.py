"""Pod CPU and memory on Kubernetes: Kubernetes quantities, one attempt's PodMetrics folded into one sample, and
`VolcanoBackend.usage_sample` against the fake API server's resource metrics API (real HTTP, the official client
unpatched): one list per namespace, the trainer container of the busiest pod, and no numbers when the API is
absent or not serving."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from jobs.backends import pod_metrics
from jobs.backends.volcano import parse_ref
from jobs.tests import test_volcano_backend as volcano_tests
from jobs.tests.test_volcano_backend import TEAM_NS, describe, observe_until

# the fake cluster and the backend, as the backend's own tests set them up
kube, logs, backend = volcano_tests.kube, volcano_tests.logs, volcano_tests.backend

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("250m", Decimal("0.25")),
        ("1", Decimal(1)),
        ("0", Decimal(0)),
        ("1500000n", Decimal("0.0015")),
        ("2133248n", Decimal("0.002133248")),
        ("100u", Decimal("0.0001")),
        ("1.5", Decimal("1.5")),
        ("+2", Decimal(2)),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("5k", Decimal(5000)),
        ("3M", Decimal(3_000_000)),
        ("2G", Decimal(2_000_000_000)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("2E", Decimal(2 * 10**18)),  # a suffix: two exa
        ("123456Ki", Decimal(123456 * 1024)),
        ("512Mi", Decimal(512 * MIB)),
        ("1Gi", Decimal(1024 * MIB)),
        ("1.5Gi", Decimal(1536 * MIB)),
        ("2Ti", Decimal(2 * 1024**4)),
        ("1Pi", Decimal(1024**5)),
        ("1Ei", Decimal(1024**6)),
        ("536870912", Decimal(512 * MIB)),  # plain bytes
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),  # an exponent, not exa then 3
        ("12e-3", Decimal("0.012")),
        ("1.5e+6", Decimal(1_500_000)),
        ("-1", Decimal(-1)),
    ],
)
def test_every_form_of_a_kubernetes_quantity(text, value):
    assert pod_metrics.quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", " 1", "1 ", "1ki", "1KI", "1e", "1e1.5", "1.2.3", "Mi", "1Mi ", "1x", "nan", "inf", "1_000", "0x10"]
)
def test_what_is_not_a_quantity_is_refused(text):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        pod_metrics.quantity(text)


def test_a_quantity_is_a_string():
    with pytest.raises(ValueError, match="a quantity is a string"):
        pod_metrics.quantity(1)


def test_cpu_in_millicores_and_memory_in_mib():
    assert pod_metrics.cpu_milli("1500000n") == pytest.approx(1.5)
    assert pod_metrics.cpu_milli("2") == 2000
    assert pod_metrics.memory_mib("123456Ki") == pytest.approx(120.5625)
    assert pod_metrics.memory_mib("1Gi") == 1024


def item(name, containers, *, at="2030-01-06T12:00:00Z"):
    return {
        "metadata": {"name": name, "namespace": TEAM_NS},
        "timestamp": at,
        "window": "15s",
        "containers": [{"name": n, "usage": {"cpu": c, "memory": m}} for n, c, m in containers],
    }


def test_a_pod_counts_its_trainer_container_only():
    pod = item("ty-a-1-main-0", [("trainer", "1500m", "2Gi"), ("tensorboard", "3", "8Gi"), ("istio-proxy", "1", "1Gi")])
    usage = pod_metrics.pod_usage(pod, container="trainer")
    assert (usage.cpu_milli, usage.memory_mib) == (1500, 2048)
    assert usage.at == datetime(2030, 1, 6, 12, tzinfo=UTC).timestamp()
    assert pod_metrics.pod_usage(item("x", [("tensorboard", "1", "1Gi")]), container="trainer") is None
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        pod_metrics.pod_usage(item("x", [("trainer", "lots", "1Gi")]), container="trainer")
    with pytest.raises(ValueError, match="no cpu or memory"):
        pod_metrics.pod_usage({"metadata": {"name": "x"}, "containers": [{"name": "trainer"}]}, container="trainer")


def test_an_attempt_keeps_its_busiest_pod_at_the_newest_measurement():
    pods = [
        pod_metrics.PodUsage("master-0", 100.0, cpu_milli=3000, memory_mib=1000),
        pod_metrics.PodUsage("worker-1", 103.0, cpu_milli=1000, memory_mib=4000),
    ]
    assert pod_metrics.attempt_sample(pods) == {"t": 103.0, "cpu_milli": 3000, "rss_mib": 4000, "pods": 2}


# ------------------------------------------------------------------------------- the backend and the fake server


def running(kube, backend, desc):
    kube.controller.script("ty-", run_ticks=None)
    ref = backend.submit(desc)
    observe_until(kube, backend, ref, lambda o: o.phase == "running")
    return ref


def pod_names(kube, ref) -> list[str]:
    return sorted(p["metadata"]["name"] for p in kube.controller.job_pods(TEAM_NS, parse_ref(ref)[1]))


def metrics_calls(kube) -> list:
    return [r for r in kube.requests if r.path.startswith("/apis/metrics.k8s.io/")]


def test_one_list_per_namespace_samples_every_running_attempt(kube, backend):
    single = running(kube, backend, describe(tensorboard=True))
    gang = running(kube, backend, describe(replicas=2))
    at = kube.now().replace(microsecond=0)
    [pod] = pod_names(kube, single)
    kube.set_pod_metrics(
        TEAM_NS,
        pod,
        {"trainer": {"cpu": "1500000000n", "memory": "2Gi"}, "tensorboard": {"cpu": "4", "memory": "9Gi"}},
        at=at,
    )
    master, worker = pod_names(kube, gang)
    kube.set_pod_metrics(TEAM_NS, master, {"trainer": {"cpu": "3", "memory": "1Gi"}}, at=at)
    kube.set_pod_metrics(TEAM_NS, worker, {"trainer": {"cpu": "500m", "memory": "4Gi"}}, at=at + timedelta(seconds=2))
    kube.create("namespaces", {"metadata": {"name": "trainyard-empty"}})
    kube.clear_requests()

    reading = backend.usage_sample([single, gang, "volcano:trainyard-empty/ty-00000000000000000000000000000000-1"])

    assert reading.unavailable == ""
    assert reading.samples[single] == {"t": at.timestamp(), "cpu_milli": 1500.0, "rss_mib": 2048.0, "pods": 1}
    # the busiest replica, CPU and memory each; at the newest measurement
    assert reading.samples[gang] == {"t": at.timestamp() + 2, "cpu_milli": 3000.0, "rss_mib": 4096.0, "pods": 2}
    calls = metrics_calls(kube)
    assert sorted(c.path for c in calls) == [
        f"/apis/metrics.k8s.io/v1beta1/namespaces/{TEAM_NS}/pods",
        "/apis/metrics.k8s.io/v1beta1/namespaces/trainyard-empty/pods",
    ]
    assert {c.param("labelSelector") for c in calls} == {"app.kubernetes.io/managed-by=trainyard"}


def test_pods_without_metrics_and_pods_of_other_attempts_give_no_sample(kube, backend):
    mine = running(kube, backend, describe())
    other = running(kube, backend, describe())
    [pod] = pod_names(kube, other)
    kube.set_pod_metrics(TEAM_NS, pod, {"trainer": {"cpu": "1", "memory": "1Gi"}})
    assert backend.usage_sample([mine]).samples == {}
    assert set(backend.usage_sample([mine, other]).samples) == {other}


def test_a_pod_with_no_trainer_metrics_gives_no_sample(kube, backend):
    ref = running(kube, backend, describe(tensorboard=True))
    [pod] = pod_names(kube, ref)
    kube.set_pod_metrics(TEAM_NS, pod, {"tensorboard": {"cpu": "1", "memory": "1Gi"}})  # the sidecar's only
    reading = backend.usage_sample([ref])
    assert reading.samples == {} and reading.skipped_pods == [] and reading.unavailable == ""


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ("absent", "is not installed (HTTP 404)"),
        ("unavailable", "is not serving (HTTP 503)"),
        ("forbidden", "needs list on pods.metrics.k8s.io"),
    ],
)
def test_no_metrics_api_means_no_numbers_and_one_reason(kube, backend, state, says):
    refs = [running(kube, backend, describe()), running(kube, backend, describe(namespace="trainyard"))]
    for ref in refs:
        for pod in pod_names(kube, ref) if parse_ref(ref)[0] == TEAM_NS else []:
            kube.set_pod_metrics(TEAM_NS, pod, {"trainer": {"cpu": "1", "memory": "1Gi"}})
    if state == "forbidden":  # the fake has no RBAC: answer as an authorizer would without the grant
        kube.fail_next(10, status=403, path="^/apis/metrics.k8s.io/", message="pods.metrics.k8s.io is forbidden")
    else:
        kube.metrics_api = state
    kube.clear_requests()
    reading = backend.usage_sample(refs)
    assert reading.samples == {}
    assert says in reading.unavailable
    assert len(metrics_calls(kube)) == 1  # the first namespace tells: the others are not asked in this pass
