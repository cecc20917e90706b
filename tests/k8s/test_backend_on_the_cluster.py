# ruff: noqa: F811 - the real-cluster fixtures are imported from test_real_cluster and used as arguments
"""Behaviours of the Volcano backend first tested only against the fake API server, now on the real control plane
(`make cluster`, docs/cluster.md): a node that vanishes under a cancel, a kubelet eviction retried on other cards,
events read in pages, queue close and reopen through Volcano's own controller, a submit repeated after a lost
answer, the inventory of a node that publishes its cards' UUIDs, an image that cannot be pulled (the trainer's or
the TensorBoard sidecar's: kwok never pulls images from the host `unpullable.invalid`), an image-build Job made
before adopted (and a create that met 409), and a finished build waiting for a registry that is down. The platform
acts as its service account; the admin kubeconfig sets the scene and reads back what the API server stored.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from images.tests.conftest import images_env, upstream  # noqa: F401 - fixtures of the image-build test
from jobs import lifecycle, logstore
from jobs.tests.test_volcano_backend import reload, submit
from tests.k8s.test_real_cluster import (  # noqa: F401 - fixtures
    KWOK_NODE_LABEL,
    TEAM_NS,
    _creates,
    _delete_build_objects,
    _drive,
    _drive_plain,
    _gpu_nodes,
    _outcome,
    _pods,
    _recreate_node,
    _state,
    _vcjobs,
    admin,
    platform,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _audit(real_cluster) -> list[dict]:
    """The API server's audit log (Metadata level): who did what to which object."""
    path = Path(real_cluster["dir"]) / "audit" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_cancel_on_a_node_that_is_gone_force_deletes_its_pods_and_ends(
    platform, admin, real_cluster, celery_worker_thread
):
    """The job's node stops answering (kwok drops it: its pods keep their last status, a deleted one stays
    Terminating as with a dead kubelet); the cancel waits on the pod. Then the machine is deleted: the platform
    force-deletes the pod (its own delete with grace 0, before the pod garbage collector's 40 s quarantine ends),
    the Volcano job's foreground delete finishes and the job is cancelled."""
    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "running"))
    node = job.attempts.get().node.name
    [pod] = _pods(admin, job)
    body = admin["api"].sanitize_for_serialization(admin["core"].read_node(node))
    admin["core"].patch_node(node, {"metadata": {"labels": {KWOK_NODE_LABEL: "lost"}}})
    try:
        time.sleep(1)  # kwok lets go of the node
        assert lifecycle.job_cancel(job_id=job.id, actor="demo").state == "cancelling"
        _drive_plain(
            lambda: admin["core"].read_namespaced_pod(pod.metadata.name, TEAM_NS).metadata.deletion_timestamp,
            timeout=30,
        )
        for _ in range(5):  # no kubelet confirms the pod's end: the cancel waits, the cards stay held
            lifecycle.attempts_observe(backend_name="volcano")
            time.sleep(0.3)
        assert reload(job).state == "cancelling"
        assert admin["core"].read_namespaced_pod(pod.metadata.name, TEAM_NS).metadata.deletion_timestamp

        admin["core"].delete_node(node)  # the machine is gone
        deleted = time.monotonic()
        job = _drive(lambda: _state(job, "cancelled"), timeout=30)
        assert time.monotonic() - deleted < 40  # the platform ended it, not the pod garbage collector
        with pytest.raises(ApiException) as gone:
            admin["core"].read_namespaced_pod(pod.metadata.name, TEAM_NS)
        assert gone.value.status == 404
        _drive(lambda: not _vcjobs(admin), timeout=30)  # the Volcano job's foreground delete finished
        forced = [
            e for e in _audit(real_cluster)
            if e.get("verb") == "delete" and (e.get("objectRef") or {}).get("resource") == "pods"
            and (e.get("objectRef") or {}).get("name") == pod.metadata.name
            and e["user"]["username"].startswith("system:serviceaccount:trainyard:")
        ]  # fmt: skip
        assert forced and all("gracePeriodSeconds=0" in e["requestURI"] for e in forced), forced
    finally:
        try:
            admin["core"].read_node(node)
        except ApiException as exc:
            if exc.status != 404:
                raise
            _recreate_node(admin, body)
        else:
            admin["core"].patch_node(node, {"metadata": {"labels": {KWOK_NODE_LABEL: "fake"}}})


def test_a_kubelet_eviction_is_retried_on_other_cards_and_then_succeeds(platform, admin, celery_worker_thread):
    """The kubelet evicts the pod (kwok's `evict` outcome: phase Failed, reason Evicted, a DisruptionTarget
    condition): the attempt is the platform's failure, its cards are excluded, the retry runs on others."""
    job = submit(platform["user"], max_retries=2)
    _drive(lambda: _state(job, "running"))
    _outcome(admin, job, "evict")

    def retried():
        fresh = reload(job)
        second = fresh.attempts.filter(number=2).first()
        return fresh if fresh.state == "running" and second is not None and second.state == "running" else None

    job = _drive(retried, timeout=120)
    first, second = job.attempts.order_by("number")
    assert (first.reason, first.failure_class, first.reaction) == ("Evicted", "platform", "retry_elsewhere")
    assert first.placement["devices"][0]["gpu_uuid"] in job.excluded_gpus
    assert second.placement["devices"][0]["gpu_uuid"] != first.placement["devices"][0]["gpu_uuid"]
    assert second.backend_ref.endswith("-2")
    assert [p.spec.node_name for p in _pods(admin, job)] == [second.node.name]
    _outcome(admin, job, "succeed")
    job = _drive(lambda: _state(job, "succeeded", "failed"))
    assert job.state == "succeeded" and job.retries_used == 1


def test_events_about_an_object_are_read_in_pages_and_only_its_own(platform, admin, monkeypatch):
    """One filtered list per object (a field selector on `involvedObject.name`), in pages that follow the API
    server's continue token: with pages of two, five events take three reads and none of another object's."""
    from jobs.backends import volcano

    backend = platform["backend"]
    target, other = f"pg-{uuid.uuid4().hex[:8]}", f"pg-{uuid.uuid4().hex[:8]}"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def event(name: str, about: str, reason: str) -> dict:
        return {
            "metadata": {"name": name, "namespace": TEAM_NS},
            "involvedObject": {"kind": "PodGroup", "name": about, "namespace": TEAM_NS, "apiVersion": "v1"},
            "reason": reason, "message": reason.lower(), "type": "Normal", "source": {"component": "volcano"},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }  # fmt: skip

    made = [event(f"{target}.{i}", target, f"R{i}") for i in range(5)] + [event(f"{other}.0", other, "Other")]
    for body in made:
        admin["core"].create_namespaced_event(TEAM_NS, body)
    try:
        monkeypatch.setattr(volcano, "EVENT_PAGE_SIZE", 2)
        reads = []
        listed = backend.core.list_namespaced_event

        def counted(*args, **kwargs):
            reads.append(kwargs)
            return listed(*args, **kwargs)

        monkeypatch.setattr(backend.core, "list_namespaced_event", counted)
        context = volcano._NamespaceContext(backend, TEAM_NS, volcano._NodeView(backend))
        assert sorted(e["reason"] for e in context.events(target)) == [f"R{i}" for i in range(5)]
        assert context.events(target)  # read once per pass
        assert len(reads) == 3, reads
        assert {r["field_selector"] for r in reads} == {f"involvedObject.name={target}"}
        assert {r["limit"] for r in reads} == {2}
    finally:
        for body in made:
            admin["core"].delete_namespaced_event(body["metadata"]["name"], TEAM_NS)


def test_closing_a_platform_queue_closes_its_volcano_queue_and_opening_it_reopens_it(
    platform, admin, celery_worker_thread
):
    """The platform closes and reopens its Volcano queue with a bus Command, which Volcano's own queue controller
    carries out; the queue borrowed work rides in keeps no capability, repaired on a sync if someone sets one."""
    from jobs.backends import volcano_render as render
    from quotas.models import Queue
    from quotas.services import queue_update

    def volcano_queue(name: str) -> dict:
        return admin["custom"].get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", name)

    queue = Queue.objects.get(name="debug")
    try:
        queue_update(queue=queue, changes={"state": "closed", "gpu_milli": 3000}, actor=None)
        closed = _drive(lambda: (q := volcano_queue(queue.volcano_name)).get("status", {}).get("state") == "Closed"
                        and q, timeout=60)  # fmt: skip
        assert closed["spec"]["capability"]["nvidia.com/gpu"] == "3"
        queue_update(queue=Queue.objects.get(name="debug"), changes={"state": "open"}, actor=None)
        _drive(lambda: volcano_queue(queue.volcano_name).get("status", {}).get("state") == "Open", timeout=60)
    finally:
        queue = Queue.objects.get(name="debug")
        if queue.state != "open":
            queue_update(queue=queue, changes={"state": "open"}, actor=None)
    borrowed = volcano_queue(render.BORROWED_QUEUE)
    assert borrowed["spec"].get("capability") in ({}, None)
    admin["custom"].patch_cluster_custom_object(
        "scheduling.volcano.sh", "v1beta1", "queues", render.BORROWED_QUEUE,
        {"spec": {"capability": {"nvidia.com/gpu": "1"}}},
    )  # fmt: skip
    platform["backend"].queue_sync(Queue.objects.get(name="debug"))
    assert volcano_queue(render.BORROWED_QUEUE)["spec"].get("capability") in ({}, None)


def test_a_submit_repeated_after_a_lost_answer_makes_one_volcano_job(platform, admin, celery_worker_thread):
    """The backend's submit is what a retried start repeats: the same attempt adopts the Volcano job the API server
    already holds (its create answered 409), another attempt of the same name is never adopted silently."""
    from dataclasses import replace

    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "running"))
    attempt = job.attempts.get()
    desc = lifecycle.describe_attempt(attempt)
    assert platform["backend"].submit(desc) == attempt.backend_ref
    assert len(_vcjobs(admin)) == 1
    with pytest.raises(RuntimeError, match="another attempt"):
        platform["backend"].submit(replace(desc, attempt_id=attempt.id + 1000))
    assert len(_vcjobs(admin)) == 1
    lifecycle.job_cancel(job_id=job.id, actor="demo")


def test_the_inventory_reads_published_card_uuids_and_marks_a_node_that_is_not_ready(platform, admin):
    """A node whose device plugin publishes its cards (HAMi's `hami.io/node-nvidia-register`) is read with those
    UUIDs and memory; a NotReady node keeps its cards and is labelled out of placement; a node without GPUs is
    not in the inventory."""
    names = _gpu_nodes(admin)
    published, unready = names[0], names[-1]
    register = "".join(f"GPU-real-{i},10,81559,100,NVIDIA-H100,0,true:" for i in range(8))
    admin["core"].patch_node(published, {"metadata": {"annotations": {"hami.io/node-nvidia-register": register}}})
    admin["core"].patch_node(unready, {"metadata": {"annotations": {"kwok.trainyard.io/ready": "false"}}})
    cpu_only = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    admin["core"].create_node({
        "metadata": {"name": "kwok-cpu-0", "labels": {KWOK_NODE_LABEL: "fake", "type": "kwok"},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"capacity": cpu_only, "allocatable": cpu_only},
    })  # fmt: skip
    try:

        def seen():
            nodes = {n.name: n for n in platform["backend"].inventory()}
            return nodes if nodes[unready].labels.get("trainyard.io/k8s-ready") == "false" else None

        nodes = _drive(seen, timeout=30)
        assert [g.uuid for g in nodes[published].gpus] == [f"GPU-real-{i}" for i in range(8)]
        assert nodes[published].gpus[0].memory_mib == 81559
        node = nodes[names[1]]
        assert (node.driver_version, node.cuda_version, len(node.gpus)) == ("550.54.15", "12.4", 8)
        assert node.cpu_milli == 94000 and node.memory_mib == 1500 * 1024
        assert len(nodes[unready].gpus) == 8
        assert set(nodes) == set(names)  # every GPU node, and not the CPU node
    finally:
        admin["core"].delete_node("kwok-cpu-0")
        admin["core"].patch_node(published, {"metadata": {"annotations": {"hami.io/node-nvidia-register": None}}})
        admin["core"].patch_node(unready, {"metadata": {"annotations": {"kwok.trainyard.io/ready": None}}})


def test_a_gangs_log_has_every_replicas_lines_behind_its_name(platform, admin, celery_worker_thread):
    """The log of a two-replica gang is copied from both pods through the API server, each line behind its
    replica's name."""
    job = submit(platform["user"], queue="distributed", replicas=2, gpus=1)
    _drive(lambda: _state(job, "running"), timeout=120)
    # The worker ends first: the master's end completes the Volcano job, which deletes a worker still running (and
    # kwok removes a deleted pod at once, before any log read).
    [worker] = [p for p in _pods(admin, job) if "-worker-" in p.metadata.name]
    ending = {"kwok.trainyard.io/outcome": "succeed", "kwok.trainyard.io/outcome-after": "0s"}
    admin["core"].patch_namespaced_pod(worker.metadata.name, TEAM_NS, {"metadata": {"annotations": ending}})
    _drive(lambda: admin["core"].read_namespaced_pod(worker.metadata.name, TEAM_NS).status.phase == "Succeeded")
    _outcome(admin, job, "succeed")
    job = _drive(lambda: _state(job, "succeeded", "failed"))
    assert job.state == "succeeded"
    lines = [line.text for line in logstore.read_lines(logstore.attempt_dir(str(job.id), 1))[0]]
    replicas = {text.split("]", 1)[0] + "]" for text in lines if text.startswith("[")}
    assert replicas == {"[master-0]", "[worker-1]"}, lines
    assert all("kwok: no container runs on this fake node" in text for text in lines if text.startswith("[")), lines


def test_hamis_per_card_resources_never_get_through_volcano(platform, admin):
    """Why TRAINYARD_K8S_SHARING=hami is refused (jobs/backends/volcano_render.py): a Volcano job asking for HAMi's
    per-card `nvidia.com/gpumem`/`gpucores`, which no node advertises, is never given pods by Volcano, whichever
    scheduler its pods name."""
    from quotas.models import Queue

    restricted = {
        "runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "25", "cpu": "1"}
    names = []
    for scheduler in ("volcano", "hami-scheduler"):
        name = f"hami-{scheduler.split('-')[0]}"
        container = {"name": "main", "image": "busybox:1", "command": ["sleep", "1"], "securityContext": restricted,
                     "resources": {"limits": limits, "requests": limits}}  # fmt: skip
        job = {
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
            "spec": {"schedulerName": "volcano", "queue": Queue.objects.get(name="train").volcano_name,
                     "minAvailable": 1,
                     "tasks": [{"name": "main", "replicas": 1, "template": {"spec": {
                         "schedulerName": scheduler, "containers": [container], "restartPolicy": "Never"}}}]},
        }  # fmt: skip
        admin["custom"].create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", TEAM_NS, "jobs", job)
        names.append(name)
    time.sleep(10)  # many scheduling cycles of Volcano's (1 s each)
    assert [p.metadata.name for p in admin["core"].list_namespaced_pod(TEAM_NS).items] == []
    for job in _vcjobs(admin):
        assert (job.get("status") or {}).get("state", {}).get("phase", "Pending") == "Pending", job.get("status")
    assert sorted(j["metadata"]["name"] for j in _vcjobs(admin)) == sorted(names)


def test_a_failed_build_job_fails_the_build_and_is_removed(
    real_cluster,
    admin,
    settings,
    images_env,  # noqa: F811
    transactional_db,
):
    """The build pod fails (kwok's `fail` outcome, patched onto the pod before kwok would complete it): the Job
    fails with BackoffLimitExceeded (`backoffLimit: 0`), the build is failed with the Job's reason in its log and no
    digest, the Job is deleted, and a later look changes nothing."""
    from kubernetes import client as k8s

    from images import k8s_build, services
    from images.tests.test_builds import define_base

    settings.TRAINYARD_IMAGE_BUILDER = "kubernetes"
    settings.TRAINYARD_K8S_KUBECONFIG = real_cluster["kubeconfig"]
    settings.TRAINYARD_K8S_API_URL = ""
    settings.TRAINYARD_K8S_BUILD_NAMESPACE = "trainyard-builds"
    base = define_base(images_env)
    build = services.build_request(image=base)
    name = k8s_build.build_name(build.pk)
    batch = k8s.BatchV1Api(admin["api"])
    try:
        build = services.build_run(build_id=build.pk)
        assert build.status == "running", build.log
        selector = f"batch.kubernetes.io/job-name={name}"
        deadline = time.monotonic() + 30
        while not (pods := admin["core"].list_namespaced_pod("trainyard-builds", label_selector=selector).items):
            assert time.monotonic() < deadline, "no build pod"
            time.sleep(0.02)
        outcome = {"kwok.trainyard.io/outcome": "fail", "kwok.trainyard.io/exit-code": "1",
                   "kwok.trainyard.io/outcome-after": "0s"}  # fmt: skip
        admin["core"].patch_namespaced_pod(
            pods[0].metadata.name, "trainyard-builds", {"metadata": {"annotations": outcome}}
        )
        deadline = time.monotonic() + 60
        while build.status == "running" and time.monotonic() < deadline:
            time.sleep(0.5)
            build = services.build_run(build_id=build.pk)
        assert build.status == "failed" and not build.digest, build.log
        assert "BackoffLimitExceeded" in build.log, build.log
        base.refresh_from_db()
        assert base.digest == ""
        with pytest.raises(ApiException) as gone:
            batch.read_namespaced_job(name, "trainyard-builds")
        assert gone.value.status == 404
        assert services.build_run(build_id=build.pk).status == "failed"  # a late look changes nothing
    finally:
        _delete_build_objects(admin, name)


UNPULLABLE = "unpullable.invalid"  # kwok's Stages never pull an image from this host (scripts/cluster/kwok-stages.yaml)


def test_an_image_that_cannot_be_pulled_is_the_pending_reason_and_fails_the_attempt_at_the_start_timeout(
    platform, admin, settings, celery_worker_thread
):
    """The trainer's image is never pulled (kwok reports ImagePullBackOff with the kubelet's message): while the
    start timeout runs the job waits saying which pod and why; past it the attempt fails with that reason and its
    Volcano job is deleted. A pull that never came is a platform failure (the image-pull rule): each retry waits its
    own start timeout, and the job fails when its retries are used."""
    from images.models import BaseImage, Registry
    from jobs.backends import reset_backends

    Registry.objects.create(host=UNPULLABLE, allowed=True)
    BaseImage.objects.filter(name="pytorch-2.5-cuda12.4").update(reference=f"{UNPULLABLE}/pytorch/pytorch:2.5.1")
    job = submit(platform["user"])
    job = _drive(lambda: "ImagePullBackOff" in (j := reload(job)).message and j, timeout=60)
    assert job.state == "starting" and "main-0: ImagePullBackOff: Back-off pulling image" in job.message, job.message
    assert f"{UNPULLABLE}/pytorch/pytorch" in job.message
    [pod] = _pods(admin, job)
    assert pod.status.phase == "Pending"
    name = pod.metadata.labels["volcano.sh/job-name"]

    settings.TRAINYARD_K8S_START_TIMEOUT_S = 0
    reset_backends()
    job = _drive(lambda: _state(job, "failed", "succeeded", "running"))
    assert job.state == "failed" and "ImagePullBackOff" in job.message, job.message
    attempts = list(job.attempts.order_by("number"))
    assert [(a.reason, a.reaction) for a in attempts] == [("ImagePullBackOff", "retry")] * (job.max_retries + 1)
    _drive_plain(lambda: name not in {j["metadata"]["name"] for j in _vcjobs(admin)}, timeout=30)


def test_the_tensorboard_sidecars_image_pull_counts_toward_the_start_timeout(
    platform, admin, settings, celery_worker_thread
):
    """Only the TensorBoard sidecar's image cannot be pulled: the trainer's can, but the pod never starts, and the
    start timeout fails each attempt naming the sidecar and its image (retried, as any image pull)."""
    from jobs.backends import reset_backends

    settings.TRAINYARD_TB_BASE_DOMAIN = "tb.example.org"
    settings.TRAINYARD_TB_IMAGE = f"{UNPULLABLE}/tensorflow/tensorflow:2.16.1"
    settings.TRAINYARD_K8S_START_TIMEOUT_S = 0
    reset_backends()
    job = submit(platform["user"], tensorboard=True)
    job = _drive(lambda: _state(job, "failed", "succeeded", "running"))
    assert {a.reason for a in job.attempts.all()} == {"ImagePullBackOff"}, job.message
    assert job.state == "failed" and job.attempts.count() == job.max_retries + 1
    assert "(tensorboard)" in job.message and f"{UNPULLABLE}/tensorflow" in job.message, job.message


def _kubernetes_builds(settings, real_cluster) -> None:
    settings.TRAINYARD_IMAGE_BUILDER = "kubernetes"
    settings.TRAINYARD_K8S_KUBECONFIG = real_cluster["kubeconfig"]
    settings.TRAINYARD_K8S_API_URL = ""
    settings.TRAINYARD_K8S_BUILD_NAMESPACE = "trainyard-builds"


def test_a_build_job_made_before_is_adopted_and_another_builds_is_refused(
    real_cluster,
    admin,
    settings,
    images_env,  # noqa: F811
    transactional_db,
):
    """A try whose create went through but whose answer was lost: the build's objects are on the API server
    already, and the next run adopts them. A create that meets 409 (the Job appeared between the look and the
    create) adopts too, read from the audit log. A Job of the same name made for another build is not adopted."""
    from kubernetes import client as k8s

    from images import k8s_build, services
    from images.tests.test_builds import define_base

    _kubernetes_builds(settings, real_cluster)
    since = datetime.now(UTC).replace(microsecond=0)
    build = services.build_request(image=define_base(images_env))
    other = services.build_request(image=define_base(images_env, name="other-base"))
    names = [k8s_build.build_name(build.pk), k8s_build.build_name(other.pk)]
    batch = k8s.BatchV1Api(admin["api"])
    jobs = k8s_build.BuildJobs.from_settings()
    try:
        assert jobs.create(build.pk, services.build_manifest(build)) is True  # made; its answer "lost"
        build = services.build_run(build_id=build.pk)
        assert build.status == "running" and "adopted the existing build Job" in build.log, build.log
        assert [j.metadata.name for j in batch.list_namespaced_job("trainyard-builds").items] == names[:1]
        assert jobs.create(build.pk, services.build_manifest(build)) is False
        assert _creates(real_cluster, "jobs", "trainyard-builds", names[0], since) == [201, 409]

        *_, job = services.build_manifest(other)
        job["metadata"]["labels"]["trainyard.io/image-build"] = "999"  # another platform sharing the namespace
        batch.create_namespaced_job("trainyard-builds", job)
        other = services.build_run(build_id=other.pk)
        assert other.status == "failed" and "belongs to image build 999" in other.log, other.log
        assert batch.read_namespaced_job(names[1], "trainyard-builds")  # not the platform's to delete
    finally:
        jobs.close()
        for name in names:
            _delete_build_objects(admin, name)


def test_a_finished_build_job_waits_for_a_registry_that_is_down(
    real_cluster,
    admin,
    settings,
    images_env,  # noqa: F811
    build_root,
    transactional_db,
):
    """The build's Job completed (kwok), but the registry does not answer: the build waits for it (no failure),
    the Job is kept until the result is recorded, and once the registry is back the build succeeds with the digest
    that was pushed, its pod's log read once."""
    from kubernetes import client as k8s

    from images import k8s_build, services
    from images.tests.test_builds import define_base
    from images.tests.test_k8s_build import push_as_buildkit
    from ops.embedded import free_port

    _kubernetes_builds(settings, real_cluster)
    build = services.build_request(image=define_base(images_env))
    digest = push_as_buildkit(build_root, build)  # what BuildKit would push (no container runs on kwok)
    name = k8s_build.build_name(build.pk)
    batch = k8s.BatchV1Api(admin["api"])
    try:
        build = services.build_run(build_id=build.pk)
        assert build.status == "running", build.log
        _drive_plain(lambda: (batch.read_namespaced_job(name, "trainyard-builds").status.succeeded or 0) == 1,
                     timeout=60)  # fmt: skip
        good = settings.TRAINYARD_REGISTRY_URL
        settings.TRAINYARD_REGISTRY_URL = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(services.RegistryWaiting):
            services.build_run(build_id=build.pk)
        build.refresh_from_db()
        assert build.status == "waiting_registry" and "registry unreachable" in build.log, build.log
        assert batch.read_namespaced_job(name, "trainyard-builds").status.succeeded == 1  # kept until recorded
        settings.TRAINYARD_REGISTRY_URL = good
        build = services.build_run(build_id=build.pk)
        assert build.status == "succeeded" and build.digest == digest, build.log
        assert build.log.count("kwok: no container runs on this fake node") == 1
    finally:
        _delete_build_objects(admin, name)


def test_the_reconcile_pass_keeps_a_running_jobs_cards_and_frees_those_of_a_volcano_job_gone(
    platform, admin, celery_worker_thread
):
    """The reconcile pass (jobs.reconcile_pool, every 10 minutes) lists the platform's Volcano jobs in every
    namespace: a running job's cards stay booked; once its Volcano job is deleted behind the platform's back (and
    before an observe pass has noticed), its slices are freed with a repair row saying which attempt held them."""
    from cluster.models import LogicalDevice, PoolRepair
    from jobs.tasks import reconcile_pool

    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "running"))
    attempt = job.attempts.get()
    assert attempt.backend_ref in platform["backend"].live_refs()
    assert reconcile_pool() == {"freed": 0, "overcommitted": []}
    held = LogicalDevice.objects.filter(attempt=attempt, released_at__isnull=True)
    assert held.count() == 1

    name = attempt.backend_ref.rsplit("/", 1)[1]
    admin["custom"].delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", TEAM_NS, "jobs", name)
    _drive_plain(lambda: name not in {j["metadata"]["name"] for j in _vcjobs(admin)}, timeout=60)
    assert attempt.backend_ref not in platform["backend"].live_refs()
    assert reconcile_pool() == {"freed": 1, "overcommitted": []}
    assert not held.exists()
    [repair] = PoolRepair.objects.filter(kind="freed_leaked_slice")
    assert f"attempt {attempt.pk} (running)" in repair.detail, repair.detail
    lifecycle.job_cancel(job_id=job.id, actor="demo")
    _drive(lambda: _state(job, "cancelled", "failed", "succeeded"))
