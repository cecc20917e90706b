"""Telemetry sources, replaced only at their boundary: NVML (a fake pynvml module) and Prometheus (a real
HTTP server on loopback answering crafted dcgm-exporter series). The emulated inventory yields nothing."""

import os
import socket
import subprocess
import sys

import pytest

from cluster.models import GPU, Node
from jobs import services as jobs
from jobs import store
from monitoring import services
from monitoring.models import Alert, GpuSample, GpuStatus, JobGpuSample
from monitoring.tests.conftest import REAL_UUIDS, api_as, emulated_gpus

pytestmark = pytest.mark.django_db


def admitted_job(user, spec="shared"):
    job, _ = jobs.job_submit(
        user=user,
        data={
            "team": "demo",
            "queue": "train",
            "spec": spec,
            "image": "python-3.11",
            "command": ["python", "train.py"],
        },
    )
    store.dispatch(queue_ids=[job.queue_id])
    job.refresh_from_db()
    assert job.state == "admitted"
    return job


def wait_for_environ(pid: int, job_id: str, timeout: float = 10.0) -> None:
    """Right after a spawn, /proc/<pid>/environ can still read empty (on this machine 207 reads of 300 made just
    after `Popen` returned were empty); the collector only ever meets processes that have long been running."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"TRAINYARD_JOB_ID={job_id}".encode() in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never showed TRAINYARD_JOB_ID={job_id} in its environment")


@pytest.fixture
def job_process(tmp_path):
    """A real process that carries a job's identity in its environment, as the local backend starts it."""
    processes = []

    def start(job_id: str, attempt: int = 1) -> int:
        env = {**os.environ, "TRAINYARD_JOB_ID": job_id, "TRAINYARD_ATTEMPT": str(attempt)}
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        processes.append(proc)
        wait_for_environ(proc.pid, job_id)
        return proc.pid

    yield start
    for proc in processes:
        proc.kill()
        proc.wait()


def test_nvml_readings_become_samples_and_process_memory_maps_to_the_job(
    db_platform, real_node, fake_nvml, job_process, outsider
):
    job = admitted_job(db_platform)
    card_uuid = job.attempts.get().placement["devices"][0]["gpu_uuid"]
    card = next(c for c in fake_nvml.cards if c.uuid == card_uuid)
    card.util, card.used_mib, card.temp_c, card.power_mw = 87, 40960, 71, 251500
    card.processes = [(job_process(str(job.id)), 3000), (os.getpid(), 500)]  # ours is no job's process

    report = services.telemetry_collect()

    assert (report.source, report.samples, report.error) == ("nvml", 2, "")
    sample = GpuSample.objects.get(gpu__uuid=card_uuid)
    assert (sample.source, sample.utilization_pct, sample.memory_used_mib, sample.memory_total_mib) == (
        "nvml",
        87,
        40960,
        81920,
    )
    assert (sample.temperature_c, sample.power_w, sample.ecc_uncorrected) == (71, 251.5, 0)
    usage = JobGpuSample.objects.get()
    assert (usage.job_id, usage.gpu.uuid, usage.memory_used_mib, usage.attempt_number) == (job.id, card_uuid, 3000, 1)

    body = api_as("demo").get(f"/api/v1/monitoring/jobs/{job.id}/telemetry/").json()
    assert body["devices"][0]["gpu"] == card_uuid and body["devices"][0]["emulated"] is False
    assert [s["utilization_pct"] for s in body["devices"][0]["samples"]] == [87.0]
    assert body["devices"][0]["samples"][0]["memory_pct"] == 50.0
    assert body["peak_memory_mib"] == 3000 and body["processes"][0]["memory_used_mib"] == 3000
    assert api_as("outsider").get(f"/api/v1/monitoring/jobs/{job.id}/telemetry/").status_code == 404


def test_a_card_without_ecc_support_still_reports_the_rest(real_node, fake_nvml):
    fake_nvml.cards[0].ecc_uncorrected = -1  # the fake answers NOT_SUPPORTED
    services.telemetry_collect()
    sample = GpuSample.objects.get(gpu__uuid=REAL_UUIDS[0])
    assert sample.ecc_uncorrected is None and sample.temperature_c == 40


def test_nvml_xid_events_fatal_and_not(real_node, fake_nvml):
    cards = fake_nvml.cards
    services.telemetry_collect()  # registers the event set
    fake_nvml.pending_xids = [(cards[0], 13), (cards[1], 79)]  # 13: the application's fault; 79: off the bus

    services.telemetry_collect()

    first, second = GPU.objects.get(uuid=REAL_UUIDS[0]), GPU.objects.get(uuid=REAL_UUIDS[1])
    assert first.health == GPU.Health.HEALTHY and GpuSample.objects.filter(gpu=first, xid=13).exists()
    assert second.health == GPU.Health.UNHEALTHY and second.quarantined
    alert = Alert.objects.get()
    assert alert.rule_name == "gpu-lost" and "Xid 79" in alert.summary


def test_a_lost_card_during_collection_leaves_service(real_node, fake_nvml):
    fake_nvml.cards[0].error = fake_nvml.NVML_ERROR_GPU_IS_LOST
    report = services.telemetry_collect()
    assert GPU.objects.get(uuid=REAL_UUIDS[0]).health == GPU.Health.UNHEALTHY
    assert Alert.objects.get().rule_name == "gpu-lost"
    assert report.samples == 1  # only the card that still answers


def test_a_card_lost_before_it_gives_its_uuid_is_found_by_node_and_index(real_node, fake_nvml):
    Node.objects.filter(name="gpu-host-1").update(name=socket.gethostname())  # as the NVML inventory names it
    fake_nvml.cards[1].lost_handle = True
    services.telemetry_collect()
    assert GPU.objects.get(uuid=REAL_UUIDS[1]).health == GPU.Health.UNHEALTHY
    assert GPU.objects.get(uuid=REAL_UUIDS[0]).health == GPU.Health.HEALTHY
    assert "GPU is lost" in Alert.objects.get(rule_name="gpu-lost").summary


def test_the_emulated_inventory_reports_no_invented_telemetry(db_platform):
    job = admitted_job(db_platform)

    report = services.telemetry_collect()

    assert report.source in {"none", "nvml"}  # "nvml" only where this machine really has a GPU
    assert not GpuSample.objects.filter(gpu__node__emulated=True).exists()
    gpus = api_as("demo").get("/api/v1/monitoring/gpus/").json()
    assert {g["telemetry"]["note"] for g in gpus if g["emulated"]} == {"emulated: no telemetry"}
    assert all(g["telemetry"]["latest"] is None for g in gpus if g["emulated"])
    card = emulated_gpus()[0]
    samples = api_as("demo").get(f"/api/v1/monitoring/gpus/{card.uuid}/samples/").json()
    assert samples == {"gpu": card.uuid, "emulated": True, "telemetry": "emulated: no telemetry", "samples": []}
    body = api_as("demo").get(f"/api/v1/monitoring/jobs/{job.id}/telemetry/").json()
    assert body["devices"][0]["telemetry"] == "emulated: no telemetry" and body["devices"][0]["samples"] == []


def dcgm(name, value, *, uuid, gpu, host_label="Hostname", host="gpu-host-1", **extra):
    labels = {
        "__name__": name,
        "gpu": str(gpu),
        "UUID": uuid,
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA A100-SXM4-80GB",
        host_label: host,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        **extra,
    }
    return labels, value


def card_series(uuid, gpu, *, util, used, free, temp, power, xid=0, host_label="Hostname", host="gpu-host-1"):
    kw = {"uuid": uuid, "gpu": gpu, "host_label": host_label, "host": host}
    return [
        dcgm("DCGM_FI_DEV_GPU_UTIL", util, **kw),
        dcgm("DCGM_FI_DEV_FB_USED", used, **kw),
        dcgm("DCGM_FI_DEV_FB_FREE", free, **kw),
        dcgm("DCGM_FI_DEV_GPU_TEMP", temp, **kw),
        dcgm("DCGM_FI_DEV_POWER_USAGE", power, **kw),
        dcgm("DCGM_FI_DEV_XID_ERRORS", xid, **kw),
    ]


@pytest.fixture
def k8s_node(real_node, prometheus, settings):
    """The same cards on a Kubernetes node: the platform cannot reach them, dcgm-exporter reports them."""
    Node.objects.filter(name="gpu-host-1").update(backend="volcano")
    settings.TRAINYARD_NVML_PROBE = False
    settings.TRAINYARD_PROMETHEUS_URL = prometheus.url
    return real_node


def test_dcgm_series_through_prometheus_with_both_host_label_spellings(db_platform, k8s_node, prometheus):
    job = admitted_job(db_platform)
    held = job.attempts.get().placement["devices"][0]["gpu_uuid"]
    other = next(u for u in REAL_UUIDS if u != held)
    index = {u: i for i, u in enumerate(REAL_UUIDS)}
    prometheus.series = (
        # a release up to 4.8 labels the host `Hostname`
        card_series(held, index[held], util=93, used=78000, free=3920, temp=66, power=301.5)
        # a later one `hostname`; this exporter's UUID label differs (MIG or old namespace): host + index decide
        + card_series(
            "GPU-not-in-the-ledger",
            index[other],
            util=5,
            used=100,
            free=81820,
            temp=35,
            power=60,
            host_label="hostname",
        )
        # a node the platform does not manage
        + card_series("GPU-elsewhere", 0, util=50, used=1, free=1, temp=1, power=1, host="other-node")
    )

    asked = len(prometheus.queries)  # the dispatcher's hand-out check asked about the placed card already
    report = services.telemetry_collect()

    assert (report.source, report.samples, report.unknown, report.error) == ("dcgm", 2, 1, "")
    assert len(prometheus.queries) == asked + 1  # one instant query for every card
    query = prometheus.queries[-1]
    assert "DCGM_FI_DEV_GPU_UTIL" in query and "DCGM_FI_DEV_XID_ERRORS" in query
    hot = GpuSample.objects.get(gpu__uuid=held)
    assert (hot.source, hot.utilization_pct, hot.memory_used_mib, hot.memory_total_mib) == ("dcgm", 93, 78000, 81920)
    assert (hot.temperature_c, hot.power_w, hot.xid) == (66, 301.5, 0)
    assert GpuSample.objects.get(gpu__uuid=other).utilization_pct == 5
    # dcgm-exporter gives vGPU pods no pod labels: the pool's ledger maps the card to the job.
    body = api_as("demo").get(f"/api/v1/monitoring/jobs/{job.id}/telemetry/").json()
    assert [s["utilization_pct"] for s in body["devices"][0]["samples"]] == [93.0]


def test_dcgm_last_xid_gauge_counts_once(k8s_node, prometheus):
    prometheus.series = card_series(REAL_UUIDS[0], 0, util=0, used=0, free=81920, temp=30, power=50, xid=48)

    services.telemetry_collect()
    services.telemetry_collect()  # the gauge still says 48: the same event, not a new one

    gpu = GPU.objects.get(uuid=REAL_UUIDS[0])
    assert gpu.health == GPU.Health.UNHEALTHY
    status = GpuStatus.objects.get(gpu=gpu)
    assert (status.fault, status.failures, status.last_xid) == ("xid", 1, 48)
    assert Alert.objects.get().rule_name == "device-unhealthy"


def test_prometheus_down_records_nothing_and_says_why(k8s_node, prometheus):
    prometheus.status = 503
    report = services.telemetry_collect()
    assert report.samples == 0 and "Prometheus" in report.error
    assert not GpuSample.objects.exists()


def test_nvml_samples_fold_into_the_attempts_usage_profile(db_platform, real_node, fake_nvml, job_process):
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import Attempt
    from monitoring.models import UsageProfile

    job = admitted_job(db_platform)
    attempt = job.attempts.get()
    now = timezone.now()
    Attempt.objects.filter(pk=attempt.pk).update(
        state="running", started_at=now - timedelta(minutes=1), backend_ref=f"local:{job.id}:1"
    )
    card_uuid = attempt.placement["devices"][0]["gpu_uuid"]
    card = next(c for c in fake_nvml.cards if c.uuid == card_uuid)
    pid = job_process(str(job.id))
    for seconds_ago, used, util in ((20, 3000, 60), (10, 5000, 80)):
        card.util, card.used_mib, card.processes = util, 40000, [(pid, used)]
        services.telemetry_collect(now=now - timedelta(seconds=seconds_ago))

    services.usage_collect(now=now)

    profile = UsageProfile.objects.get(attempt=attempt)
    # Memory from NVML's per-process accounting (not the card's 40,000 MiB); utilization is the card's.
    assert profile.gpu_source == "nvml" and profile.gpu_memory_peak_mib == 5000
    assert profile.gpu_util_mean_pct == 70 and profile.gpu_samples == 2 and not profile.final
    services.usage_collect(now=now)  # nothing new: nothing counted twice
    assert UsageProfile.objects.get(attempt=attempt).gpu_samples == 2
