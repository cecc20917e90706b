"""The fake API server's resource metrics API (`metrics.k8s.io/v1beta1` pods) against the official client: the
shapes metrics-server answers with, label selectors, which pods have metrics, and a cluster without the API."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fake_k8s import FakeKubernetes

GROUP, VERSION = "metrics.k8s.io", "v1beta1"
AT = datetime(2030, 1, 6, 12, 0, 5, tzinfo=UTC)


def pod(kube, name, labels, *, sidecar=False):
    spec = {"containers": [{"name": "trainer", "image": "registry.local/t:1"}]}
    if sidecar:
        spec["initContainers"] = [{"name": "tensorboard", "image": "registry.local/tb:1", "restartPolicy": "Always"}]
    kube.create("pods", {"metadata": {"name": name, "labels": labels}, "spec": spec}, "default")


@pytest.fixture
def kube():
    with FakeKubernetes(volcano=True) as fake:
        fake.controller.script("run-", run_ticks=None)
        pod(fake, "run-a", {"team": "a"}, sidecar=True)
        pod(fake, "run-b", {"team": "b"})
        pod(fake, "done-c", {"team": "a"})
        fake.controller.tick(3)
        fake.controller.fail_pod("default", "done-c", exit_code=0)  # its command ended
        assert fake.get("pods", "done-c", "default")["status"]["phase"] == "Succeeded"
        yield fake
        assert fake.internal_errors == []


@pytest.fixture
def metrics(kube):
    with kube.api_client() as api:
        yield client.CustomObjectsApi(api)


def test_pod_metrics_have_metrics_servers_shape(kube, metrics):
    kube.set_pod_metrics(
        "default",
        "run-a",
        {"trainer": {"cpu": "1500000n", "memory": "1048576"}, "tensorboard": {"cpu": 1, "memory": "123456789"}},
        at=AT,
    )
    body = metrics.list_namespaced_custom_object(GROUP, VERSION, "default", "pods")
    assert (body["kind"], body["apiVersion"]) == ("PodMetricsList", "metrics.k8s.io/v1beta1")
    [item] = body["items"]
    assert set(item) == {"metadata", "timestamp", "window", "containers"}  # list items carry no kind
    assert item["metadata"]["name"] == "run-a" and item["metadata"]["labels"] == {"team": "a"}
    assert (item["timestamp"], item["window"]) == ("2030-01-06T12:00:05Z", "15s")
    assert item["containers"] == [  # CPU in decimal units, memory in binary ones
        {"name": "trainer", "usage": {"cpu": "1500u", "memory": "1Mi"}},
        {"name": "tensorboard", "usage": {"cpu": "1", "memory": "123456789"}},
    ]
    one = metrics.get_namespaced_custom_object(GROUP, VERSION, "default", "pods", "run-a")
    assert one["kind"] == "PodMetrics" and one["containers"] == item["containers"]


def test_lists_take_label_selectors_and_only_running_pods_with_metrics_appear(kube, metrics):
    for name in ("run-a", "run-b", "done-c"):
        kube.set_pod_metrics("default", name, {"trainer": {"cpu": "1", "memory": "1Gi"}})
    names = lambda body: [i["metadata"]["name"] for i in body["items"]]  # noqa: E731
    assert names(metrics.list_namespaced_custom_object(GROUP, VERSION, "default", "pods")) == ["run-a", "run-b"]
    selected = metrics.list_namespaced_custom_object(GROUP, VERSION, "default", "pods", label_selector="team=a")
    assert names(selected) == ["run-a"]
    assert names(metrics.list_cluster_custom_object(GROUP, VERSION, "pods")) == ["run-a", "run-b"]
    # metrics-server lists from its pod cache: a namespace that does not exist is an empty list, not a 404
    assert metrics.list_namespaced_custom_object(GROUP, VERSION, "nowhere", "pods")["items"] == []
    kube.clear_pod_metrics("default", "run-b")
    with pytest.raises(ApiException) as err:
        metrics.get_namespaced_custom_object(GROUP, VERSION, "default", "pods", "run-b")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        metrics.list_namespaced_custom_object(GROUP, VERSION, "default", "pods", watch=True)
    assert err.value.status == 405


def test_metrics_server_reports_cpu_and_memory_only(kube):
    with pytest.raises(ValueError, match="exactly cpu and memory"):
        kube.set_pod_metrics("default", "run-a", {"trainer": {"cpu": "1"}})
    with pytest.raises(ValueError, match="quantities must match"):
        kube.set_pod_metrics("default", "run-a", {"trainer": {"cpu": "a lot", "memory": "1Gi"}})


@pytest.mark.parametrize(("state", "status"), [("absent", 404), ("unavailable", 503)])
def test_a_cluster_without_the_metrics_api(kube, metrics, state, status):
    kube.set_pod_metrics("default", "run-a", {"trainer": {"cpu": "1", "memory": "1Gi"}})
    kube.metrics_api = state
    with pytest.raises(ApiException) as err:
        metrics.list_namespaced_custom_object(GROUP, VERSION, "default", "pods")
    assert err.value.status == status
    with kube.api_client() as api:
        groups = [g.name for g in client.ApisApi(api).get_api_versions().groups]
    assert (GROUP in groups) == (state == "unavailable")  # an APIService that is registered but not serving
