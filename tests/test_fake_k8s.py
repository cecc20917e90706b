"""Tests of the fake Kubernetes API server, driven through the unpatched official `kubernetes` client.

They pin the Kubernetes and Volcano behaviour the harness promises (status codes and Status bodies,
optimistic concurrency, selectors, watches, CRD validation, the simulated Volcano lifecycle, fault
injection), so that a backend tested against the fake behaves the same against a real API server.
Tests that need the Volcano CRDs skip when the shared CRD folder is absent.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import urllib3
from kubernetes import client

from tests.fake_k8s import FakeKubernetes, crds, crds_available, unavailable_reason

JSON = dict[str, Any]
VC_GROUP, VC_VERSION, JOBS = "batch.volcano.sh", "v1alpha1", "jobs"
SCHED_GROUP, SCHED_VERSION = "scheduling.volcano.sh", "v1beta1"
NS = "default"


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    """A fake cluster with Volcano installed (skips when the CRD files are absent)."""
    crds.require()
    with FakeKubernetes() as fake:
        yield fake
        assert fake.internal_errors == []
        assert fake.controller is not None


@pytest.fixture
def core_only() -> Iterator[FakeKubernetes]:
    """A fake API server without Volcano; runs even without the CRD files."""
    with FakeKubernetes(volcano=False) as fake:
        yield fake
        assert fake.internal_errors == []


@pytest.fixture
def api(kube: FakeKubernetes) -> Iterator[client.ApiClient]:
    with kube.api_client() as api_client:
        yield api_client


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def vcjob(
    name: str, *, replicas: int = 1, gpus: int = 1, queue: str = "default", policies: list[JSON] | None = None
) -> JSON:
    """A vcjob as the platform's backend would write it (everything the webhook defaults set explicitly)."""
    spec: JSON = {
        "schedulerName": "volcano",
        "queue": queue,
        "minAvailable": replicas,
        "maxRetry": 1,
        "tasks": [
            {
                "name": "main",
                "replicas": replicas,
                "minAvailable": replicas,
                "maxRetry": 1,
                "template": {
                    "metadata": {"labels": {"trainyard.io/job": name}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "registry.example/train:1.0",
                                "command": ["python", "train.py"],
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "16Gi"}},
                            }
                        ],
                    },
                },
            }
        ],
    }
    if policies is not None:
        spec["policies"] = policies
    return {"apiVersion": f"{VC_GROUP}/{VC_VERSION}", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def submit(custom: client.CustomObjectsApi, job: JSON, namespace: str = NS) -> JSON:
    return custom.create_namespaced_custom_object(VC_GROUP, VC_VERSION, namespace, JOBS, job)


def get_job(custom: client.CustomObjectsApi, name: str, namespace: str = NS) -> JSON:
    return custom.get_namespaced_custom_object(VC_GROUP, VC_VERSION, namespace, JOBS, name)


def status_body(error: client.ApiException) -> JSON:
    body = json.loads(error.body)
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == error.status
    return body


# --- core API semantics ---------------------------------------------------------------------------


def test_duplicate_vcjob_create_is_409_already_exists(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    first = submit(custom, vcjob("dup"))
    assert first["metadata"]["uid"] and first["metadata"]["generation"] == 1
    assert int(first["metadata"]["resourceVersion"]) > 0 and first["metadata"]["creationTimestamp"]

    with pytest.raises(client.ApiException) as raised:
        submit(custom, vcjob("dup"))

    body = status_body(raised.value)
    assert raised.value.status == 409
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'jobs.batch.volcano.sh "dup" already exists'
    assert body["details"] == {"name": "dup", "group": "batch.volcano.sh", "kind": "jobs"}
    assert get_job(custom, "dup")["metadata"]["uid"] == first["metadata"]["uid"]


def test_missing_objects_are_404_not_found(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    with pytest.raises(client.ApiException) as raised:
        get_job(custom, "nope")
    body = status_body(raised.value)
    assert (raised.value.status, body["reason"]) == (404, "NotFound")
    assert body["message"] == 'jobs.batch.volcano.sh "nope" not found'

    with pytest.raises(client.ApiException) as raised:
        core.read_namespaced_pod("nope", NS)
    assert status_body(raised.value)["message"] == 'pods "nope" not found'

    with pytest.raises(client.ApiException) as raised:
        submit(custom, vcjob("x"), namespace="no-such-namespace")
    assert raised.value.status == 404
    assert status_body(raised.value)["message"] == 'namespaces "no-such-namespace" not found'


def test_label_selectors_on_lists(core_only: FakeKubernetes) -> None:
    with core_only.api_client() as api:
        core = client.CoreV1Api(api)
        for name, labels in {
            "a": {"team": "vision", "tier": "gpu"},
            "b": {"team": "nlp", "tier": "gpu"},
            "c": {"team": "nlp"},
            "d": {},
        }.items():
            core.create_namespaced_config_map(NS, {"metadata": {"name": name, "labels": labels}, "data": {}})

        def names(selector: str) -> list[str]:
            return [cm.metadata.name for cm in core.list_namespaced_config_map(NS, label_selector=selector).items]

        assert names("team=nlp") == ["b", "c"]
        assert names("team==vision") == ["a"]
        assert names("team!=nlp") == ["a", "d"]  # != also matches objects without the label
        assert names("team in (vision, nlp),tier") == ["a", "b"]
        assert names("team notin (vision)") == ["b", "c", "d"]
        assert names("!tier") == ["c", "d"]
        assert names("tier,!team") == []
        with pytest.raises(client.ApiException) as raised:
            names("team in vision")
        assert raised.value.status == 400


def test_field_selectors_and_pagination(core_only: FakeKubernetes) -> None:
    with core_only.api_client() as api:
        core = client.CoreV1Api(api)
        for index in range(5):
            core.create_namespaced_config_map(NS, {"metadata": {"name": f"cm-{index}"}})
        assert [
            c.metadata.name for c in core.list_namespaced_config_map(NS, field_selector="metadata.name=cm-3").items
        ] == ["cm-3"]
        with pytest.raises(client.ApiException) as raised:
            core.list_namespaced_config_map(NS, field_selector="status.phase=Running")
        assert raised.value.status == 400 and "field label not supported" in status_body(raised.value)["message"]

        first = core.list_namespaced_config_map(NS, limit=2)
        assert [c.metadata.name for c in first.items] == ["cm-0", "cm-1"]
        assert first.metadata.remaining_item_count == 3
        second = core.list_namespaced_config_map(NS, limit=2, _continue=first.metadata._continue)
        assert [c.metadata.name for c in second.items] == ["cm-2", "cm-3"]


def test_stale_resource_version_on_replace_is_409_conflict(
    kube: FakeKubernetes, custom: client.CustomObjectsApi
) -> None:
    created = submit(custom, vcjob("rv"))
    fresh = copy.deepcopy(created)
    fresh["spec"]["minAvailable"] = 1
    fresh["spec"]["tasks"][0]["replicas"] = 2
    updated = custom.replace_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, "rv", fresh)
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert updated["metadata"]["generation"] == 2

    stale = copy.deepcopy(created)
    stale["spec"]["tasks"][0]["replicas"] = 3
    with pytest.raises(client.ApiException) as raised:
        custom.replace_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, "rv", stale)
    body = status_body(raised.value)
    assert (raised.value.status, body["reason"]) == (409, "Conflict")
    assert "the object has been modified" in body["message"]

    unconditional = copy.deepcopy(updated)
    del unconditional["metadata"]["resourceVersion"]
    with pytest.raises(client.ApiException) as raised:
        custom.replace_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, "rv", unconditional)
    assert raised.value.status == 422  # custom resources refuse updates without a resourceVersion


def test_merge_and_json_patches(kube: FakeKubernetes, custom: client.CustomObjectsApi, api: client.ApiClient) -> None:
    submit(custom, vcjob("patchy"))
    patched = custom.patch_namespaced_custom_object(
        VC_GROUP, VC_VERSION, NS, JOBS, "patchy", {"metadata": {"labels": {"trainyard.io/attempt": "1"}}}
    )
    assert patched["metadata"]["labels"] == {"trainyard.io/attempt": "1"}
    assert patched["metadata"]["generation"] == 1  # metadata changes do not bump the generation

    patched = custom.patch_namespaced_custom_object(
        VC_GROUP,
        VC_VERSION,
        NS,
        JOBS,
        "patchy",
        [{"op": "replace", "path": "/metadata/labels/trainyard.io~1attempt", "value": "2"}],
        _content_type="application/json-patch+json",
    )
    assert patched["metadata"]["labels"]["trainyard.io/attempt"] == "2"

    with pytest.raises(client.ApiException) as raised:
        custom.patch_namespaced_custom_object(
            VC_GROUP, VC_VERSION, NS, JOBS, "patchy", {"metadata": {"resourceVersion": "1"}}
        )
    assert raised.value.status == 409

    with pytest.raises(client.ApiException) as raised:
        custom.patch_namespaced_custom_object(
            VC_GROUP,
            VC_VERSION,
            NS,
            JOBS,
            "patchy",
            {"spec": {"queue": "x"}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert raised.value.status == 415  # custom resources have no strategic merge patch


def test_status_subresource_separates_spec_from_status(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    created = submit(custom, {**vcjob("st"), "status": {"state": {"phase": "Completed"}}})
    assert "status" not in created  # status is dropped on create
    kube.controller.tick()
    current = get_job(custom, "st")
    current["status"]["state"]["phase"] = "Completed"
    current["spec"]["tasks"][0]["replicas"] = 2
    replaced = custom.replace_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, "st", current)
    assert replaced["status"]["state"]["phase"] == "Pending"  # the main resource ignores status
    assert replaced["spec"]["tasks"][0]["replicas"] == 2

    patched = custom.patch_namespaced_custom_object_status(
        VC_GROUP,
        VC_VERSION,
        NS,
        JOBS,
        "st",
        {"status": {"state": {"phase": "Running"}}, "spec": {"queue": "x"}},
    )
    assert patched["status"]["state"]["phase"] == "Running"
    assert patched["spec"]["queue"] == "default"  # and /status ignores everything else
    assert patched["metadata"]["generation"] == replaced["metadata"]["generation"]


def test_crd_module_validates_and_locates_the_crds(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    crds.require()
    schema = crds.crd_schema(VC_GROUP, VC_VERSION, JOBS)
    assert "tasks" in schema["properties"]["spec"]["properties"]

    minimal = vcjob("defaults")
    del minimal["spec"]["maxRetry"]
    assert crds.validate(minimal)["spec"]["maxRetry"] == 3  # the schema's default

    wrong = vcjob("wrong")
    wrong["spec"]["tasks"][0]["replicas"] = "two"
    wrong["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(crds.UnknownFieldsError) as unknown:
        crds.validate(wrong)
    assert unknown.value.paths == ["spec.tasks[0].template.spec.containers[0].imagePullPolicyy"]
    with pytest.raises(crds.CrdValidationError) as raised:
        crds.validate(wrong, field_validation="Ignore")
    assert raised.value.paths == ["spec.tasks[0].replicas"]
    assert "spec.tasks[0].replicas in body must be of type integer" in str(raised.value)

    monkeypatch.setenv(crds.ENV_VAR, str(tmp_path))
    assert not crds_available()
    assert str(tmp_path) in unavailable_reason()


@pytest.mark.parametrize("ci", ["true", ""])
def test_missing_crds_skip_with_how_to_get_them_but_fail_under_ci(ci, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(crds.ENV_VAR, str(tmp_path))
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected) as stopped:
        crds.require()
    message = str(stopped.value)
    assert "config/crd/volcano/bases" in message and "v1.9.0" in message and crds.ENV_VAR in message
    assert ("CI=true" in message) is bool(ci)
    assert set(crds.release_dirs()) == {"v1.9.0", "v1.12.0", "v1.14.0", "newest"}
    assert crds.release_version("v1.12.0") == (1, 12) and crds.release_version("newest") is None


def test_schema_invalid_vcjob_is_422_and_typos_are_pruned_unless_strict(
    kube: FakeKubernetes, custom: client.CustomObjectsApi
) -> None:
    bad = vcjob("bad")
    bad["spec"]["tasks"][0]["replicas"] = -1
    bad["spec"]["policies"] = [{"event": "NoSuchEvent", "action": "RestartJob"}]
    with pytest.raises(client.ApiException) as raised:
        submit(custom, bad)
    body = status_body(raised.value)
    assert (raised.value.status, body["reason"]) == (422, "Invalid")
    assert body["message"].startswith('Job.batch.volcano.sh "bad" is invalid: ')
    fields = {c["field"]: c["reason"] for c in body["details"]["causes"]}
    assert fields == {
        "spec.tasks[0].replicas": "FieldValueInvalid",
        "spec.policies[0].event": "FieldValueNotSupported",
    }

    # A structural schema drops unknown fields silently for a client that does not ask for strictness (the
    # official client never does, and never reads the warning): the typo is simply gone.
    typo = vcjob("typo")
    typo["spec"]["minAvaliable"] = 1
    created = submit(custom, typo)
    assert "minAvaliable" not in created["spec"]
    assert kube.pruned == ['Job typo: unknown field "spec.minAvaliable"']
    strict = vcjob("strict")
    strict["spec"]["minAvaliable"] = 1
    with pytest.raises(client.ApiException) as raised:
        custom.create_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, strict, field_validation="Strict")
    assert raised.value.status == 400
    assert 'unknown field "spec.minAvaliable"' in status_body(raised.value)["message"]
    assert kube.try_get("jobs.batch.volcano.sh", "bad", NS) is None
    assert kube.try_get("jobs.batch.volcano.sh", "strict", NS) is None


def test_volcano_webhook_rejects_what_the_real_one_rejects(
    kube: FakeKubernetes, custom: client.CustomObjectsApi
) -> None:
    internal_event = vcjob("internal", policies=[{"event": "OutOfSync", "action": "RestartJob"}])
    with pytest.raises(client.ApiException) as raised:
        submit(custom, internal_event)
    assert raised.value.status == 400
    assert "denied the request: invalid policy event OutOfSync" in status_body(raised.value)["message"]

    with pytest.raises(client.ApiException) as raised:
        submit(custom, vcjob("lost", queue="no-such-queue"))
    assert "unable to find job queue" in status_body(raised.value)["message"]

    custom.create_cluster_custom_object(
        SCHED_GROUP,
        SCHED_VERSION,
        "queues",
        {
            "apiVersion": f"{SCHED_GROUP}/{SCHED_VERSION}",
            "kind": "Queue",
            "metadata": {"name": "closed"},
            "spec": {"weight": 1},
        },
    )
    kube.controller.set_queue_state("closed", "Closed")
    with pytest.raises(client.ApiException) as raised:
        submit(custom, vcjob("late", queue="closed"))
    assert "can only submit job to queue with state `Open`" in status_body(raised.value)["message"]


def test_lifecycle_pending_running_completed(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    kube.controller.script("ok-", logs="epoch 1\nepoch 2\ndone", run_ticks=2)
    submit(custom, vcjob("ok-1", replicas=2))
    phases = []
    for _ in range(10):
        kube.controller.tick()
        phase = get_job(custom, "ok-1")["status"]["state"]["phase"]
        if not phases or phases[-1] != phase:
            phases.append(phase)
    assert phases == ["Pending", "Running", "Completed"]

    job = get_job(custom, "ok-1")
    assert job["status"]["succeeded"] == 2 and job["status"]["minAvailable"] == 2
    pods = core.list_namespaced_pod(NS, label_selector="volcano.sh/job-name=ok-1").items
    assert sorted(p.metadata.name for p in pods) == ["ok-1-main-0", "ok-1-main-1"]
    pod = pods[0]
    assert pod.metadata.labels["volcano.sh/job-namespace"] == NS
    assert pod.metadata.labels["volcano.sh/queue-name"] == "default"
    assert pod.metadata.labels["volcano.sh/task-spec"] == "main"
    assert pod.metadata.labels["trainyard.io/job"] == "ok-1"  # template labels are kept
    assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == f"ok-1-{job['metadata']['uid']}"
    assert pod.metadata.owner_references[0].kind == "Job" and pod.metadata.owner_references[0].controller
    assert pod.status.phase == "Succeeded" and pod.spec.node_name == "gpu-node-0"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    podgroup = custom.get_namespaced_custom_object(
        SCHED_GROUP, SCHED_VERSION, NS, "podgroups", f"ok-1-{job['metadata']['uid']}"
    )
    assert podgroup["spec"]["minMember"] == 2 and podgroup["spec"]["minResources"]["nvidia.com/gpu"] == "2"


def test_failed_job_reports_the_exit_code(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    kube.controller.script("oom", exit_code=137, reason="OOMKilled", logs="RuntimeError: CUDA out of memory")
    submit(custom, vcjob("oom"))
    job = kube.controller.wait_for_job_phase(NS, "oom", "Failed")
    assert job["status"]["failed"] == 1
    pod = core.read_namespaced_pod("oom-main-0", NS)
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")
    assert core.read_namespaced_pod_log("oom-main-0", NS) == "RuntimeError: CUDA out of memory\n"


def test_queue_capability_keeps_job_pending_with_unschedulable_podgroup(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    custom.create_cluster_custom_object(
        SCHED_GROUP,
        SCHED_VERSION,
        "queues",
        {
            "apiVersion": f"{SCHED_GROUP}/{SCHED_VERSION}",
            "kind": "Queue",
            "metadata": {"name": "team-a"},
            "spec": {
                "weight": 1,
                "reclaimable": False,
                "capability": {"nvidia.com/gpu": "2", "cpu": "64", "memory": "256Gi"},
            },
        },
    )
    kube.controller.script("fits", run_ticks=6)
    kube.controller.script("big", run_ticks=None)
    submit(custom, vcjob("fits", gpus=2, queue="team-a"))
    submit(custom, vcjob("big", gpus=1, queue="team-a"))
    kube.controller.tick(4)

    assert get_job(custom, "big")["status"]["state"]["phase"] == "Pending"
    assert core.list_namespaced_pod(NS, label_selector="volcano.sh/job-name=big").items == []  # no pods at all
    uid = get_job(custom, "big")["metadata"]["uid"]
    podgroup = custom.get_namespaced_custom_object(SCHED_GROUP, SCHED_VERSION, NS, "podgroups", f"big-{uid}")
    assert podgroup["status"]["phase"] == "Pending"
    condition = next(c for c in podgroup["status"]["conditions"] if c["type"] == "Unschedulable")
    assert (condition["status"], condition["reason"]) == ("True", "NotEnoughResources")
    pg_events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name=big-{uid}").items
    assert "queue resource quota insufficient" in {e.message for e in pg_events}
    job_events = core.list_namespaced_event(NS, field_selector="involvedObject.name=big").items
    assert any(e.reason == "PodGroupPending" and e.type == "Warning" for e in job_events)

    kube.controller.wait_for_job_phase(NS, "fits", "Completed")  # its GPUs go back to the queue
    kube.controller.wait_for_job_phase(NS, "big", "Running")
    queue = custom.get_cluster_custom_object(SCHED_GROUP, SCHED_VERSION, "queues", "team-a")
    assert queue["status"]["allocated"]["nvidia.com/gpu"] == "1"


def test_gang_waits_for_enough_nodes(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    submit(custom, vcjob("gang", replicas=3, gpus=4))  # 12 GPUs; the node has 8
    kube.controller.tick(3)
    pods = core.list_namespaced_pod(NS, label_selector="volcano.sh/job-name=gang").items
    assert pods == [] or all(not p.spec.node_name for p in pods)
    assert get_job(custom, "gang")["status"]["state"]["phase"] == "Pending"

    kube.add_node("gpu-node-1")
    kube.controller.wait_for_job_phase(NS, "gang", "Running")
    nodes = {p.spec.node_name for p in core.list_namespaced_pod(NS, label_selector="volcano.sh/job-name=gang").items}
    assert nodes == {"gpu-node-0", "gpu-node-1"}


def test_pod_logs(kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api) -> None:
    kube.controller.script("logs", logs=[f"step {i}" for i in range(10)], run_ticks=5, start_ticks=1)
    submit(custom, vcjob("logs"))
    kube.controller.run_until(lambda: bool(kube.controller.job_pods(NS, "logs")))  # bound, still creating

    with pytest.raises(client.ApiException) as raised:
        core.read_namespaced_pod_log("logs-main-0", NS)
    assert (
        raised.value.status == 400 and "is waiting to start: ContainerCreating" in status_body(raised.value)["message"]
    )

    kube.controller.wait_for_job_phase(NS, "logs", "Completed")
    assert core.read_namespaced_pod_log("logs-main-0", NS).splitlines() == [f"step {i}" for i in range(10)]
    assert core.read_namespaced_pod_log("logs-main-0", NS, tail_lines=2) == "step 8\nstep 9\n"
    stamped = core.read_namespaced_pod_log("logs-main-0", NS, container="trainer", timestamps=True).splitlines()
    assert stamped[0].endswith(" step 0") and stamped[0][:4].isdigit()

    with pytest.raises(client.ApiException) as raised:
        core.read_namespaced_pod_log("logs-main-0", NS, container="sidecar")
    assert raised.value.status == 400
    with pytest.raises(client.ApiException) as raised:
        core.read_namespaced_pod_log("no-such-pod", NS)
    assert raised.value.status == 404


def test_exit_code_policy_restarts_the_pod_and_scripts_apply_per_attempt(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    job = vcjob("flaky", replicas=2, policies=[{"exitCode": 3, "action": "RestartPod"}])
    job["spec"]["maxRetry"] = 3
    kube.controller.script("flaky", run_ticks=2, logs="ok")
    kube.controller.script("flaky", index=1, times=1, exit_code=3, logs="NCCL timeout")  # first attempt only
    submit(custom, job)
    done = kube.controller.wait_for_job_phase(NS, "flaky", ["Completed", "Failed"])
    assert done["status"]["state"]["phase"] == "Completed"
    assert done["status"]["retryCount"] == 1 and done["status"]["succeeded"] == 2
    assert core.read_namespaced_pod_log("flaky-main-1", NS) == "ok\n"
    restarts = core.list_namespaced_event(NS, field_selector="involvedObject.name=flaky,reason=ExecuteAction").items
    assert [e.message.strip() for e in restarts] == ["Start to execute action RestartPod"]


def test_preemption_evicts_the_pod_with_volcanos_evict_event(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    kube.controller.script("victim", run_ticks=None)
    submit(custom, vcjob("victim", policies=[{"event": "PodEvicted", "action": "TerminateJob"}]))
    kube.controller.wait_for_job_phase(NS, "victim", "Running")
    kube.controller.preempt_pod(NS, "victim-main-0")
    kube.controller.wait_for_job_phase(NS, "victim", "Terminated")
    assert kube.try_get("pods", "victim-main-0", NS) is None
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=victim-main-0").items
    assert [(e.reason, e.message) for e in events if e.reason == "Evict"] == [
        ("Evict", "Pod is evicted, because of preempt")
    ]


def test_svc_plugin_network_policy_unless_disabled(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    for name, args in (("isolated", []), ("open", ["--disable-network-policy"])):
        job = vcjob(name, replicas=2)
        job["spec"]["plugins"] = {"svc": args}
        submit(custom, job)
        kube.controller.wait_for_job_phase(NS, name, "Running")
    networking = client.NetworkingV1Api(kube.api_client())
    policies = {p.metadata.name: p for p in networking.list_namespaced_network_policy(NS).items}
    assert set(policies) == {"isolated"}
    ingress = policies["isolated"].spec.ingress
    assert [peer.pod_selector.match_labels for rule in ingress for peer in rule._from] == [
        {"volcano.sh/job-name": "isolated", "volcano.sh/job-namespace": NS}
    ]


def test_installed_crds_are_served(kube: FakeKubernetes) -> None:
    extensions = client.ApiextensionsV1Api(kube.api_client())
    crd = extensions.read_custom_resource_definition("queues.scheduling.volcano.sh")
    assert crd.spec.group == "scheduling.volcano.sh" and crd.spec.scope == "Cluster"


def test_foreground_deletion_waits_for_dependents(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    kube.controller.script("fg", run_ticks=None)
    submit(custom, vcjob("fg"))
    kube.controller.wait_for_job_phase(NS, "fg", "Running")
    custom.delete_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, "fg", propagation_policy="Foreground")
    deleting = get_job(custom, "fg")
    assert deleting["metadata"]["deletionTimestamp"] and deleting["metadata"]["finalizers"] == ["foregroundDeletion"]
    kube.controller.tick()  # the kubelet finishes the pod; then the job goes
    with pytest.raises(client.ApiException) as raised:
        get_job(custom, "fg")
    assert raised.value.status == 404


def test_deleting_a_vcjob_deletes_its_pods_and_podgroup(
    kube: FakeKubernetes, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    kube.controller.script("gone", run_ticks=None)
    uid = submit(custom, vcjob("gone", replicas=2))["metadata"]["uid"]
    kube.controller.wait_for_job_phase(NS, "gone", "Running")
    status = custom.delete_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, "gone")
    assert status["status"] == "Success" and status["details"]["uid"] == uid
    assert custom.list_namespaced_custom_object(SCHED_GROUP, SCHED_VERSION, NS, "podgroups")["items"] == []
    pods = core.list_namespaced_pod(NS, label_selector="volcano.sh/job-name=gone").items
    assert pods and all(p.metadata.deletion_timestamp for p in pods)  # graceful: terminating first
    kube.controller.tick()
    assert core.list_namespaced_pod(NS, label_selector="volcano.sh/job-name=gone").items == []


def test_abort_command_stops_a_job(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    kube.controller.script("abort", run_ticks=None)
    job = submit(custom, vcjob("abort"))
    kube.controller.wait_for_job_phase(NS, "abort", "Running")
    reference = {
        "apiVersion": f"{VC_GROUP}/{VC_VERSION}",
        "kind": "Job",
        "name": "abort",
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    custom.create_namespaced_custom_object(
        "bus.volcano.sh",
        "v1alpha1",
        NS,
        "commands",
        {
            "apiVersion": "bus.volcano.sh/v1alpha1",
            "kind": "Command",
            "metadata": {"generateName": "abort-abortjob-", "ownerReferences": [reference]},
            "target": reference,
            "action": "AbortJob",
        },
    )
    kube.controller.wait_for_job_phase(NS, "abort", "Aborted")
    assert custom.list_namespaced_custom_object("bus.volcano.sh", "v1alpha1", NS, "commands")["items"] == []


def test_deadline_and_ttl_follow_the_server_clock() -> None:
    crds.require()
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    with FakeKubernetes(clock=lambda: now[0]) as kube, kube.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        job = vcjob("deadline")
        job["spec"]["ttlSecondsAfterFinished"] = 60
        job["spec"]["tasks"][0]["template"]["spec"]["activeDeadlineSeconds"] = 600
        kube.controller.script("deadline", run_ticks=None)
        submit(custom, job)
        kube.controller.wait_for_job_phase(NS, "deadline", "Running")

        now[0] += timedelta(minutes=11)
        kube.controller.tick()
        pod = core.read_namespaced_pod("deadline-main-0", NS)
        assert (pod.status.phase, pod.status.reason) == ("Failed", "DeadlineExceeded")
        kube.controller.wait_for_job_phase(NS, "deadline", "Failed")
        kube.controller.tick(3)
        assert get_job(custom, "deadline")  # kept until the TTL has passed

        now[0] += timedelta(seconds=61)
        kube.controller.tick()
        with pytest.raises(client.ApiException) as raised:
            get_job(custom, "deadline")
        assert raised.value.status == 404
        assert kube.internal_errors == []


def test_plain_pods_run_and_unknown_schedulers_never_bind(kube: FakeKubernetes, core: client.CoreV1Api) -> None:
    container = {"name": "c", "image": "busybox:1.36"}
    core.create_namespaced_pod(
        NS, {"metadata": {"name": "plain"}, "spec": {"restartPolicy": "Never", "containers": [container]}}
    )
    core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": "hami"},
            "spec": {"schedulerName": "hami-scheduler", "containers": [container]},
        },
    )
    kube.controller.script("plain", exit_code=2, logs="usage: train.py [-h]")
    kube.controller.tick(3)
    plain = core.read_namespaced_pod("plain", NS)
    assert plain.status.phase == "Failed" and plain.status.container_statuses[0].state.terminated.exit_code == 2
    assert plain.spec.scheduler_name == "default-scheduler"  # defaulted by the API server
    hami = core.read_namespaced_pod("hami", NS)
    assert hami.status.phase == "Pending" and hami.spec.node_name is None

    gpu_by_request_only = {**container, "resources": {"requests": {"nvidia.com/gpu": "1"}}}
    with pytest.raises(client.ApiException) as raised:
        core.create_namespaced_pod(NS, {"metadata": {"name": "bad"}, "spec": {"containers": [gpu_by_request_only]}})
    assert raised.value.status == 422
    assert [c["field"] for c in status_body(raised.value)["details"]["causes"]] == [
        "spec.containers[0].resources.limits"
    ]


def test_services_and_ingresses(core_only: FakeKubernetes) -> None:
    with core_only.api_client() as api:
        core, networking = client.CoreV1Api(api), client.NetworkingV1Api(api)
        core.create_namespaced_service(
            NS, {"metadata": {"name": "tb-1"}, "spec": {"selector": {"app": "tb"}, "ports": [{"port": 6006}]}}
        )
        service = core.read_namespaced_service("tb-1", NS)
        assert service.spec.cluster_ip.startswith("10.96.") and service.spec.ports[0].target_port == 6006
        with pytest.raises(client.ApiException) as raised:
            core.create_namespaced_service(NS, {"metadata": {"name": "1-tb"}, "spec": {"ports": [{"port": 1}]}})
        assert raised.value.status == 422  # service names are DNS-1035 labels

        rule = {
            "host": "job-1.tb.example.com",
            "http": {
                "paths": [
                    {
                        "path": "/",
                        "pathType": "Prefix",
                        "backend": {"service": {"name": "tb-1", "port": {"number": 6006}}},
                    }
                ]
            },
        }
        networking.create_namespaced_ingress(NS, {"metadata": {"name": "tb-1"}, "spec": {"rules": [rule]}})
        regex = copy.deepcopy(rule)
        regex["http"]["paths"][0]["pathType"] = "Regex"
        with pytest.raises(client.ApiException) as raised:
            networking.create_namespaced_ingress(NS, {"metadata": {"name": "tb-2"}, "spec": {"rules": [regex]}})
        assert raised.value.status == 422
        assert [i.metadata.name for i in networking.list_namespaced_ingress(NS).items] == ["tb-1"]

        networking.delete_namespaced_ingress("tb-1", NS)
        core.delete_namespaced_service("tb-1", NS)
        assert networking.list_namespaced_ingress(NS).items == [] and core.list_namespaced_service(NS).items == []


# --- fault injection ------------------------------------------------------------------------------


def test_injected_500_then_success(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    kube.fail_next(1, method="POST", path=r"/jobs$")
    with pytest.raises(client.ApiException) as raised:
        submit(custom, vcjob("retry-me"))
    assert raised.value.status == 500 and status_body(raised.value)["reason"] == "InternalError"
    submit(custom, vcjob("retry-me"))

    creates = kube.requests_matching("POST", r"/namespaces/default/jobs$")
    assert [r.status for r in creates] == [500, 201]
    assert len(kube.requests_matching("POST", r"/jobs$", handled=True)) == 1  # exactly one create reached the API


def test_throttling_answers_429_with_retry_after(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    kube.throttle_next(1, retry_after=3, method="POST")
    with pytest.raises(client.ApiException) as raised:
        submit(custom, vcjob("throttled"))
    assert raised.value.status == 429
    assert raised.value.headers["Retry-After"] == "3"
    assert status_body(raised.value)["details"]["retryAfterSeconds"] == 3
    assert kube.try_get("jobs.batch.volcano.sh", "throttled", NS) is None

    # urllib3 (under the official client) itself honours Retry-After for idempotent methods.
    kube.throttle_next(1, retry_after=1, method="GET")
    custom.list_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS)
    assert [r.status for r in kube.requests_matching("GET", r"/jobs$")] == [429, 200]


def test_hung_create_still_takes_effect(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    kube.hang_next(1, seconds=1.0, method="POST", path=r"/jobs$")
    with pytest.raises(urllib3.exceptions.HTTPError):
        custom.create_namespaced_custom_object(VC_GROUP, VC_VERSION, NS, JOBS, vcjob("slow"), _request_timeout=0.2)
    time.sleep(1.2)
    with pytest.raises(client.ApiException) as raised:
        submit(custom, vcjob("slow"))  # the retry learns that the first attempt went through
    assert raised.value.status == 409


def test_dropped_connection(kube: FakeKubernetes, custom: client.CustomObjectsApi) -> None:
    kube.drop_next(1, method="POST")
    with pytest.raises(urllib3.exceptions.HTTPError):
        submit(custom, vcjob("dropped"))
    assert kube.try_get("jobs.batch.volcano.sh", "dropped", NS) is None
    assert kube.requests_matching("POST")[-1].status is None
