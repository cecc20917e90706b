"""The Volcano backend against the fake Kubernetes API server (real HTTP, the official client unpatched): only what
the real control plane of `make cluster` cannot be made to do (tests/k8s has the rest; docs/cluster.md lists both).

Injected API faults (500s, 429 throttling, hung and dropped requests, a refused connection), alone and end to end
through a real Celery worker; the Volcano vGPU device plugin's card choice (no deviceshare plugin runs in `make
cluster`); Volcano's own preemption; a server too old for the platform; and each Volcano release's CRD schemas.
Everything skips when the Volcano CRDs in ../shared are absent.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import pytest

from jobs import classifier, lifecycle, logstore
from jobs.backends import volcano_render as render
from jobs.backends.base import AttemptDescription, Device
from jobs.backends.volcano import VolcanoBackend, VolcanoConfig, node_info, parse_ref
from jobs.models import FailureRule
from tests.fake_k8s import FakeKubernetes, crds

JOBS = "jobs.batch.volcano.sh"
QUEUES = "queues.scheduling.volcano.sh"
TEAM_NS = "trainyard-demo"
DRIVER = "550.90.07"


def gfd_labels(rack: str) -> dict[str, str]:
    # The fake labels only the driver's major version and `.full`; GPU Feature Discovery also sets these.
    return {
        "nvidia.com/cuda.driver-version.minor": "90",
        "nvidia.com/cuda.driver-version.revision": "07",
        "trainyard.io/rack": rack,
    }


@pytest.fixture
def kube():
    crds.require()
    with FakeKubernetes(nodes=0) as fake:
        for index, rack in enumerate(("r1", "r1")):
            fake.add_node(
                f"gpu-node-{index}",
                driver_version=DRIVER,
                labels=gfd_labels(rack),
                gpu_product="NVIDIA-L4",
                gpu_memory_mib=24576,
            )
        for namespace in (TEAM_NS, "trainyard"):
            fake.create("namespaces", {"metadata": {"name": namespace}})
        yield fake
        assert fake.internal_errors == []


@pytest.fixture
def logs(settings, tmp_path):
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    return tmp_path / "logs"


def make_backend(kube: FakeKubernetes, **overrides) -> VolcanoBackend:
    config = dict(
        render=render.RenderOptions(grace_s=1),
        request_timeout_s=0.5,
        retries=4,
        backoff_s=0.01,
        backoff_max_s=0.05,
        start_timeout_s=3600,
        system_namespace="trainyard",
        tb_base_domain="tb.example.org",
    )
    config.update(overrides)
    return VolcanoBackend(kube.api_client(), VolcanoConfig(**config))


@dataclass
class PlatformQueue:
    """What `queue_sync` reads of a platform queue (the model's fields and methods it uses)."""

    name: str = "train"
    state: str = "open"
    weight: int = 2
    priority: int = 10
    ordering: str = "fifo"
    quota: dict = field(
        default_factory=lambda: {"gpu_milli": 4000, "gpu_memory_mib": 98304, "cpu_milli": 64000, "memory_mib": 262144}
    )

    @property
    def volcano_name(self) -> str:
        return f"trainyard-{self.name}"

    def vector(self) -> dict:
        return dict(self.quota)


@pytest.fixture
def backend(kube, logs):
    backend = make_backend(kube)
    backend.queue_sync(PlatformQueue())
    return backend


def describe(
    *, replicas: int = 1, gpus: int = 1, number: int = 1, job_id: str | None = None, **overrides
) -> AttemptDescription:
    devices = [
        Device(
            gpu_uuid=f"GPU-{r}{g}",
            gpu_index=g,
            node=f"gpu-node-{r % 2}",
            compute_milli=1000,
            memory_mib=81559,
            exclusive=True,
        )
        for r in range(replicas)
        for g in range(gpus)
    ]
    fields = dict(
        job_id=job_id or str(uuid.uuid4()),
        attempt_id=number * 10,
        attempt_number=number,
        name="t",
        owner="demo",
        team="demo",
        namespace=TEAM_NS,
        queue="train",
        volcano_queue="trainyard-train",
        image="docker.io/library/python:3.11-slim@sha256:" + "4" * 64,
        command=["python", "train.py"],
        args=[],
        env={},
        working_dir="",
        replicas=replicas,
        gpu_count=gpus,
        exclusive=True,
        cpu_milli=4000,
        memory_mib=16384,
        timeout_s=3600,
        priority=0,
        min_driver_version="550.54",
        tensorboard=False,
        tensorboard_logdir="",
        devices=devices,
        gang=replicas > 1,
    )
    fields.update(overrides)
    return AttemptDescription(**fields)


def is_worker(pod) -> bool:
    return (pod["metadata"].get("labels") or {}).get("volcano.sh/task-spec", "").startswith("worker-")


def observe_until(kube, backend, ref, done, *, ticks=30):
    for _ in range(ticks):
        obs = backend.observe([ref])[ref]
        if done(obs):
            return obs
        kube.controller.tick()
    raise AssertionError(f"not reached; last observation {obs}")


def log_lines(desc: AttemptDescription) -> list[str]:
    lines, _ = logstore.read_lines(logstore.attempt_dir(desc.job_id, desc.attempt_number))
    return [line.text for line in lines]


def vcjobs(kube) -> list[dict]:
    return kube.list(JOBS, TEAM_NS)


# ------------------------------------------------------------------------------------------ the backend alone


@pytest.mark.parametrize(
    ("reason", "exit_code", "expected"),
    [
        ("Evict", None, ("platform", "retry_elsewhere", "evicted-or-lost")),
        ("Preempted", None, ("platform", "retry_elsewhere", "evicted-or-lost")),
        ("Terminated", 143, ("platform", "retry_elsewhere", "evicted-or-lost")),
        ("NodeLost", None, ("platform", "retry_elsewhere", "evicted-or-lost")),
        ("DeadlineExceeded", 137, ("user", "no_retry", "deadline-exceeded")),
    ],
)
def test_default_rules_classify_what_a_cluster_reports(reason, exit_code, expected):
    rules = [FailureRule(**data) for data in sorted(classifier.DEFAULT_RULES, key=lambda d: d["order"])]
    verdict = classifier.classify(classifier.Observation(exit_code=exit_code, reason=reason), rules)
    assert (verdict.failure_class, verdict.reaction, verdict.rule) == expected


@pytest.mark.parametrize("release", list(crds.RELEASES) + ["newest"])
def test_each_volcano_release_takes_every_object_the_platform_writes_without_dropping_a_field(release, logs):
    folder = crds.release_dirs()[release]
    crds.require(folder)
    version = crds.release_version(release) or (99, 0)
    catalog = crds.load_catalog(str(folder))
    with FakeKubernetes(crd_dir=str(folder), nodes=0) as kube:
        for index in range(2):
            kube.add_node(f"gpu-node-{index}", driver_version=DRIVER, labels=gfd_labels("r1"))
        for namespace in (TEAM_NS, "trainyard"):
            kube.create("namespaces", {"metadata": {"name": namespace}})
        backend = make_backend(kube)  # TRAINYARD_VOLCANO_VERSION=auto: read off the installed Queue CRD
        queue = PlatformQueue()
        backend.queue_sync(queue)
        spec = kube.get(QUEUES, "trainyard-train")["spec"]
        assert ("priority" in spec) is (version >= (1, 10)) and ("dequeueStrategy" in spec) is (version >= (1, 14))
        kube.controller.script("ty-", run_ticks=None)
        refs = [backend.submit(describe()), backend.submit(describe(replicas=2, tensorboard=True))]
        observe_until(kube, backend, refs[1], lambda o: o.phase == "running")
        queue.state = "closed"
        backend.queue_sync(queue)  # a bus Command
        assert kube.pruned == []  # nothing the platform (or Volcano, from it) wrote lost a field
        for resource in ("jobs", "podgroups", "queues", "commands"):
            group, version_, plural = {
                "jobs": render.JOB_API,
                "podgroups": render.PODGROUP_API,
                "queues": render.QUEUE_API,
                "commands": render.COMMAND_API,
            }[resource]
            found = kube.list(f"{plural}.{group}")
            assert found or resource == "commands"  # the controller consumes commands
            for obj in found:
                catalog.validate({k: v for k, v in obj.items() if k != "status"})  # strict


def test_a_setting_that_cannot_work_is_a_startup_error(settings):
    from jobs.checks import volcano_backend_settings

    settings.TRAINYARD_BACKEND = "volcano"
    settings.TRAINYARD_S3_URL = "http://s3.storage.svc:8333"
    settings.TRAINYARD_REGISTRY_URL = "https://registry.example.com"
    settings.TRAINYARD_K8S_PLATFORM_IMAGE = "registry.example.com/trainyard:0.1.0"
    assert volcano_backend_settings() == []
    for name, value, named in (
        ("TRAINYARD_K8S_SHARING", "hami", "TRAINYARD_K8S_SHARING=volcano-vgpu"),
        ("TRAINYARD_K8S_TTL_S", 0, "TRAINYARD_K8S_TTL_S"),
        ("TRAINYARD_VOLCANO_VERSION", "1.8", "TRAINYARD_VOLCANO_VERSION"),
        ("TRAINYARD_VOLCANO_VERSION", "newest", "TRAINYARD_VOLCANO_VERSION"),
    ):
        before = getattr(settings, name)
        setattr(settings, name, value)
        errors = volcano_backend_settings()
        assert [e.id for e in errors] == ["jobs.E001"] and named in errors[0].msg
        setattr(settings, name, before)
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_K8S_SHARING = "hami"
    assert volcano_backend_settings() == []  # only the Volcano backend reads it


@pytest.mark.parametrize(
    ("name", "value", "code", "said"),
    [
        ("TRAINYARD_S3_URL", "http://127.0.0.1:8333", "jobs.E002", "loopback"),
        ("TRAINYARD_S3_URL", "http://localhost:9000", "jobs.E002", "loopback"),
        ("TRAINYARD_S3_URL", "", "jobs.E002", "is unset"),
        ("TRAINYARD_REGISTRY_URL", "http://[::1]:5000", "jobs.E002", "loopback"),
        ("TRAINYARD_K8S_PLATFORM_IMAGE", "trainyard:0.1.0", "jobs.E003", "names no registry"),
        ("TRAINYARD_K8S_PLATFORM_IMAGE", "localhost:5000/trainyard:0.1.0", "jobs.E003", "loopback registry"),
        ("TRAINYARD_K8S_PLATFORM_IMAGE", "127.0.0.1:5000/trainyard:0.1.0", "jobs.E003", "loopback registry"),
    ],
)
def test_an_address_pods_cannot_reach_is_a_startup_error(settings, name, value, code, said):
    """`make run` hands pods its embedded servers' loopback addresses; on the Volcano backend that is refused at
    startup, naming the setting, instead of pods that silently cannot reach the object store or the registry."""
    from jobs.checks import volcano_backend_settings

    settings.TRAINYARD_BACKEND = "volcano"
    settings.TRAINYARD_S3_URL = "http://s3.storage.svc:8333"
    settings.TRAINYARD_REGISTRY_URL = "registry.example.com"
    settings.TRAINYARD_K8S_PLATFORM_IMAGE = "registry.example.com/trainyard:0.1.0"
    assert volcano_backend_settings() == []
    setattr(settings, name, value)
    errors = volcano_backend_settings()
    assert [e.id for e in errors] == [code] and said in errors[0].msg and name in errors[0].msg


def test_a_pod_volcano_preempts_is_reported_as_preempted(kube, backend):
    """Volcano's own preemption or reclaim (an `Evict` event from its scheduler and a graceful delete): the real
    scheduler of `make cluster` was not made to take that decision (tests/k8s covers the kubelet's eviction and the
    platform's own preemption), so its outcome is played here."""
    kube.controller.script("ty-", run_ticks=None)
    preempted = describe()
    ref = backend.submit(preempted)
    observe_until(kube, backend, ref, lambda o: o.phase == "running")
    kube.controller.preempt_pod(TEAM_NS, f"{render.job_name(preempted.job_id, 1)}-main-0")
    kube.controller.tick(5)
    seen = backend.observe([ref])[ref]
    assert (seen.phase, seen.reason) == ("failed", "Preempted")


def test_api_faults_are_retried_without_duplicates(kube, backend):
    backend = make_backend(kube, retries=6)
    kube.controller.script("ty-", run_ticks=3)
    kube.fail_next(1, status=500, method="POST", path=r"/jobs$")
    kube.throttle_next(1, retry_after=0, method="POST", path=r"/jobs$")
    kube.hang_next(1, seconds=1.0, method="POST", path=r"/jobs$", process=True)  # the client times out...
    kube.drop_next(1, method="POST", path=r"/jobs$", process=True)  # ...or loses the answer; both went through
    desc = describe()
    ref = backend.submit(desc)
    time.sleep(1.1)  # let the hung create finish on the server side
    assert backend.submit(desc) == ref
    assert len(vcjobs(kube)) == 1  # the hung and the dropped create both reached the API; one job exists
    statuses = [r.status for r in kube.requests_matching("POST", r"/jobs$")]
    assert statuses[:2] == [500, 429] and statuses[-1] == 409 and len(statuses) == 6

    kube.fail_next(2, status=503, method="GET", path=r"/pods$")
    assert backend.observe([ref])[ref].phase in ("pending", "running")
    kube.fail_next(50, status=500, method="GET", path=r"/jobs$")
    assert backend.observe([ref]) == {}  # an unreadable cluster is not a lost job
    kube.clear_faults()
    assert observe_until(kube, backend, ref, lambda o: o.finished).phase == "succeeded"


def test_retries_stop_within_the_call_budget_and_a_dead_api_ends_the_pass(kube, logs):
    backend = make_backend(kube, retries=50, request_timeout_s=0.3, backoff_s=0.2, backoff_max_s=0.2, call_budget_s=1.5)
    kube.hang_next(100, seconds=2.0, method="GET", path=r"/jobs$")
    name = render.job_name(str(uuid.uuid4()), 1)
    refs = [f"volcano:{TEAM_NS}/{name}", f"volcano:other-team/{name}"]
    started = time.monotonic()
    assert backend.observe(refs) == {}  # not observed (never "lost")
    assert time.monotonic() - started < 2.5
    tried = kube.requests_matching("GET", r"/jobs$")
    assert 2 <= len(tried) <= 6  # retried, but only as often as fits the budget
    assert len({r.path for r in tried}) == 1  # the API is down, not one namespace: the pass ends there
    kube.clear_faults()
    time.sleep(2.1)  # let the hung requests finish before the server stops


def test_connection_refused_fails_the_submit_after_retries(kube, logs):
    backend = make_backend(kube)
    kube.stop()
    started = time.monotonic()
    with pytest.raises(Exception, match="(?i)connect|refused|Max retries"):
        backend.submit(describe())
    assert time.monotonic() - started < 10


def test_node_info_divides_time_sliced_cards():
    node = {
        "metadata": {"name": "ts", "labels": {"nvidia.com/gpu.replicas": "4"}},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "500m", "memory": "2Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    info = node_info(node, ["trainyard.io/rack"])
    assert len(info.gpus) == 2 and info.cpu_milli == 500 and info.memory_mib == 2048
    assert info.gpus[0].uuid == "K8S-ts-0"


@pytest.mark.parametrize(
    ("allocatable", "labels", "cards", "mode"),
    [
        # renameByDefault time-slicing: only the shared resource, `replicas` units per card
        ({"nvidia.com/gpu.shared": "16"}, {"nvidia.com/gpu.replicas": "4"}, 4, "time-sliced"),
        (
            {"nvidia.com/gpu.shared": "16"},
            {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.replicas": "4"},
            4,
            "time-sliced",
        ),
        ({"nvidia.com/gpu": "8"}, {}, 8, "whole"),
        ({"nvidia.com/gpu": "8", "nvidia.com/gpu.shared": "8"}, {}, 8, None),  # both: either kind fits
    ],
)
def test_node_info_records_what_the_device_plugin_hands_out(allocatable, labels, cards, mode):
    node = {
        "metadata": {"name": "n", "labels": {"nvidia.com/gpu.present": "true", **labels}},
        "status": {
            "allocatable": {**allocatable, "cpu": "8", "memory": "64Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    info = node_info(node, [], shared_resource="nvidia.com/gpu.shared")
    assert len(info.gpus) == cards
    assert info.labels.get("trainyard.io/gpu-sharing") == mode
    # Only the `whole` provider (which names its shared resource) records a mode.
    assert "trainyard.io/gpu-sharing" not in node_info(node, []).labels


def test_node_info_reads_the_driver_from_older_gpu_feature_discovery_labels():
    node = {
        "metadata": {
            "name": "old-gfd",
            "labels": {
                "nvidia.com/gpu.count": "2",
                "nvidia.com/cuda.driver.major": "535",
                "nvidia.com/cuda.driver.minor": "183",
                "nvidia.com/cuda.driver.rev": "01",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": "2"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert node_info(node, []).driver_version == "535.183.01"


# ------------------------------------------------------------------------------------------ end to end


@pytest.fixture
def platform(kube, settings, tmp_path, transactional_db):
    """A seeded platform on the volcano backend, its queues and inventory synced from the fake cluster."""
    from cluster.services import inventory_sync
    from jobs.backends import get_backend, reset_backends
    from ops.seed import seed
    from quotas.models import Queue

    settings.TRAINYARD_BACKEND = "volcano"
    settings.TRAINYARD_K8S_API_URL = kube.url
    settings.TRAINYARD_K8S_REQUEST_TIMEOUT_S = 0.5
    settings.TRAINYARD_K8S_RETRIES = 4
    settings.TRAINYARD_K8S_NAMESPACE = "trainyard"
    settings.TRAINYARD_NVML_PROBE = False  # the cards are in the (fake) cluster, not on this machine
    settings.TRAINYARD_CANCEL_GRACE_S = 1.0
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    settings.TRAINYARD_WORK_ROOT = tmp_path / "work"
    settings.TRAINYARD_TB_BASE_DOMAIN = "tb.example.org"
    settings.TRAINYARD_TB_GRACE_S = 0
    reset_backends()
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    from jobs.tests.conftest import pin_catalog

    pin_catalog()
    backend = get_backend()
    for queue in Queue.objects.all():
        backend.queue_sync(queue)
    for info in backend.inventory():
        inventory_sync(info=info, backend="volcano")
    from django.contrib.auth import get_user_model

    yield get_user_model().objects.get(username="demo")
    reset_backends()


@pytest.fixture
def vgpu_platform(request, kube, settings):
    """The platform with TRAINYARD_K8S_SHARING=volcano-vgpu on nodes that run Volcano's vGPU device plugin."""
    for node in kube.list("nodes"):
        name = node["metadata"]["name"]
        register = "".join(f"GPU-{name}-{i},10,24576,100,NVIDIA-L4,0,true:" for i in range(8))

        def annotate(n, register=register):
            n["metadata"].setdefault("annotations", {})["volcano.sh/node-vgpu-register"] = register

        def advertise(n):
            n["status"]["allocatable"].update(
                {
                    "volcano.sh/vgpu-number": "80",
                    "volcano.sh/vgpu-memory": str(8 * 24576),
                    "volcano.sh/vgpu-cores": "800",
                }
            )

        kube.mutate("nodes", name, None, annotate)
        kube.mutate("nodes", name, None, advertise, subresource="status")
    settings.TRAINYARD_K8S_SHARING = "volcano-vgpu"
    return request.getfixturevalue("platform")


def drive(kube, predicate, *, timeout=30.0):
    """Let the cluster run (controller ticks) and the platform observe it, until predicate() holds."""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kube.controller.tick()
        lifecycle.attempts_observe(backend_name="volcano")
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def submit(user, **overrides):
    from jobs import services

    data = {
        "team": "demo",
        "queue": "train",
        "spec": "guaranteed",
        "image": "pytorch-2.5-cuda12.4",
        "command": ["python", "train.py"],
    }
    data.update(overrides)
    job, created = services.job_submit(user=user, data=data)
    assert created
    return job


def reload(job):
    from jobs.models import Job

    return Job.objects.get(pk=job.pk)


def finished(job):
    fresh = reload(job)
    return fresh if fresh.is_terminal else None


def state_path(job) -> list[str]:
    return [s for s in reload(job).events.order_by("at", "id").values_list("to_state", flat=True) if s]


def attempt_ref(job, number=1) -> str:
    return reload(job).attempts.get(number=number).backend_ref


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_e2e_api_faults_leave_no_duplicate_and_no_lost_job(kube, platform, celery_worker_thread):
    kube.controller.script("ty-", run_ticks=4)
    kube.throttle_next(2, retry_after=0, method="POST", path=r"/jobs$")
    kube.hang_next(1, seconds=1.0, method="POST", path=r"/jobs$", process=True)
    kube.fail_next(3, status=500, method="GET", path=r"/pods$")
    job = submit(platform)
    job = drive(kube, lambda: finished(job))
    assert job.state == "succeeded" and job.attempts.count() == 1
    created = [r for r in kube.requests_matching("POST", r"/jobs$") if r.status == 201]
    assert len(created) <= 1 and len(vcjobs(kube)) == 1  # the hung create may be the one that made it
    assert not job.events.filter(kind="attempt_failed").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_e2e_the_ledger_follows_the_cards_volcanos_vgpu_scheduler_chose(kube, vgpu_platform, celery_worker_thread):
    from cluster.models import LogicalDevice, PoolRepair

    kube.controller.script("ty-", run_ticks=None)
    job = submit(vgpu_platform, spec="shared")
    attempt = drive(kube, lambda: reload(job).attempts.filter(state="running").first())
    pod = kube.controller.job_pods(TEAM_NS, parse_ref(attempt.backend_ref)[1])[0]
    placed = pod["metadata"]["annotations"]["volcano.sh/vgpu-use-gpuuuid"]  # the card the platform placed it on
    chosen = pod["metadata"]["annotations"]["volcano.sh/vgpu-ids-new"].split(",")[0]
    assert chosen != placed  # released Volcano ignores the pin
    drive(kube, lambda: LogicalDevice.objects.filter(attempt=attempt, gpu__uuid=chosen).exists())
    assert not LogicalDevice.objects.filter(attempt=attempt, gpu__uuid=placed).exists()
    assert PoolRepair.objects.filter(kind="slice_moved", gpu__uuid=chosen).count() == 1
    moved = reload(job).events.get(kind="slices_moved")
    assert moved.data == {"moved": {placed: chosen}}
    attempt.refresh_from_db()
    assert attempt.placement["devices"][0]["gpu_uuid"] == chosen
    drive(kube, lambda: True)  # observing again moves nothing more
    assert PoolRepair.objects.filter(kind="slice_moved").count() == 1


def test_a_cluster_too_old_for_the_platform_is_refused_with_what_it_needs(kube, backend, monkeypatch):
    """Kubernetes before 1.29 refuses every pod with the checkpoint sidecar (a native sidecar), and before 1.27
    image builds never find their pod: the backend says so at once instead of failing silently."""
    from jobs.backends import volcano
    from tests.fake_k8s import server

    assert backend.cluster_check().startswith("Kubernetes v1.34")
    monkeypatch.setitem(server.KUBERNETES_VERSION, "minor", "27+")
    monkeypatch.setitem(server.KUBERNETES_VERSION, "gitVersion", "v1.27.16-gke.100")
    old = make_backend(kube)
    with pytest.raises(volcano.ClusterUnsupported, match=r"Kubernetes v1\.27\.16-gke\.100; Trainyard needs 1\.29"):
        old.submit(describe())
    assert kube.list(JOBS, TEAM_NS) == []
