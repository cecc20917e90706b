"""On a machine with an NVIDIA GPU: the NVML inventory and collector read the real cards, and jobs the platform
places run CUDA work on exactly the card (or slice) they were given.

Skipped wherever NVML finds no GPU (CI, laptops). Run them with `make test-gpu` on a GPU machine; the CUDA
workloads run with `TRAINYARD_GPU_TEST_PYTHON` (an interpreter with PyTorch and CUDA; default: this one) and are
skipped when it has none.
"""

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from cluster import inventory
from jobs import lifecycle, logstore, services
from jobs.models import Job
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from monitoring import collectors


def _gpu_count() -> int:
    nvml = collectors.load_nvml()
    if nvml is None:
        return 0
    try:
        return nvml.nvmlDeviceGetCount()
    except nvml.NVMLError:
        return 0


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpu_count() == 0, reason="no NVIDIA GPU visible through NVML on this machine"),
]


# The interpreter the CUDA workloads run with: one that has PyTorch with CUDA (the platform's own venv has not).
JOB_PYTHON = os.environ.get("TRAINYARD_GPU_TEST_PYTHON") or sys.executable


def _torch_cuda() -> bool:
    if _gpu_count() == 0:
        return False
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([JOB_PYTHON, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_torch = pytest.mark.skipif(
    not _torch_cuda(), reason="no PyTorch with CUDA in TRAINYARD_GPU_TEST_PYTHON (or this interpreter)"
)


def _smi_rows() -> list[dict]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = []
    for line in out.strip().splitlines():
        index, gpu_uuid, name, memory, driver = (part.strip() for part in line.split(","))
        rows.append({"index": int(index), "uuid": gpu_uuid, "name": name, "memory_mib": int(memory), "driver": driver})
    return rows


def test_inventory_reads_the_real_cards_as_nvidia_smi_reports_them():
    node = inventory.read_nvml()
    assert node is not None and not node.emulated
    assert node.driver_version and node.cuda_version
    assert len(node.gpus) == _gpu_count()
    for gpu in node.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.memory_mib > 1024 and gpu.model
    smi = _smi_rows()
    if smi:
        assert [g.uuid for g in node.gpus] == [r["uuid"] for r in smi]
        assert [g.model for g in node.gpus] == [r["name"] for r in smi]
        assert node.driver_version == smi[0]["driver"]
        for gpu, row in zip(node.gpus, smi, strict=True):
            assert abs(gpu.memory_mib - row["memory_mib"]) <= 1  # NVML bytes // MiB vs nvidia-smi's rounding
    print(
        "inventory:",
        node.name,
        node.driver_version,
        node.cuda_version,
        [(g.index, g.uuid, g.model, g.memory_mib) for g in node.gpus],
    )


HOLDER = (
    "import sys, time, torch\n"
    "x = torch.empty(int(sys.argv[1]) * 1024 * 1024, dtype=torch.uint8, device='cuda:0')\n"
    "y = torch.randn(4096, 4096, device='cuda:0')\n"
    "for _ in range(20): y = y @ y; y = y / y.norm()\n"
    "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(float(sys.argv[2]))\n"
)


@needs_torch
def test_collector_reads_memory_utilization_temperature_power_and_the_job_holding_the_card():
    job_id = str(uuid.uuid4())
    nvml = collectors.load_nvml()
    collector = collectors.NvmlCollector(nvml)
    before = {r.uuid: r for r in collector.collect()}
    card = inventory.read_nvml().gpus[0]
    holder = subprocess.Popen(
        [JOB_PYTHON, "-c", HOLDER, "2048", "30"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": card.uuid, "TRAINYARD_JOB_ID": job_id, "TRAINYARD_ATTEMPT": "1"},
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        reading = next(r for r in collector.collect() if r.uuid == card.uuid)
        print("reading:", reading)
        assert not reading.fault
        assert reading.memory_total_mib == pytest.approx(card.memory_mib, abs=1)
        assert reading.memory_used_mib >= before[card.uuid].memory_used_mib + 2000
        assert reading.temperature_c is not None and 0 < reading.temperature_c < 110
        assert reading.power_w is not None and reading.power_w > 0
        assert reading.utilization_pct is not None and 0 <= reading.utilization_pct <= 100
        ours = [p for p in reading.processes if p.job_id == job_id]
        listed = [(p.pid, round(p.memory_used_mib)) for p in reading.processes]
        print("processes on the card:", listed, "holder pid", holder.pid)
        assert ours and ours[0].attempt_number == 1 and ours[0].memory_used_mib >= 2000, listed
    finally:
        holder.kill()
        holder.wait()


CUDA_JOB = (
    "import os, torch\n"
    "p = torch.cuda.get_device_properties(0)\n"
    "print('visible', os.environ['CUDA_VISIBLE_DEVICES'], 'count', torch.cuda.device_count())\n"
    "print('card', torch.cuda.get_device_name(0), 'uuid', p.uuid)\n"
    "print('limit', os.environ.get('CUDA_DEVICE_MEMORY_LIMIT', 'none'))\n"
    "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
    "torch.cuda.synchronize()\n"
    "import time; t = time.perf_counter()\n"
    "for _ in range(10): b = a @ a\n"
    "torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10\n"
    "print('tflops %.0f' % (2 * 8192 ** 3 / dt / 1e12))\n"
)


def _log(job) -> str:
    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), 1))
    return "\n".join(line.text for line in lines)


@needs_torch
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("spec", "expect_limit"), [("guaranteed", False), ("shared", True)])
def test_a_job_runs_cuda_work_on_the_card_it_was_placed_on(platform, celery_worker_thread, spec, expect_limit):
    job, created = services.job_submit(
        user=platform,
        data={
            "team": "demo",
            "queue": "train",
            "spec": spec,
            "image": "python-3.11",
            "command": [JOB_PYTHON, "-c", CUDA_JOB],
        },
    )
    assert created
    try:
        job = wait_for(
            lambda: (lambda j: j if j.is_terminal else None)(Job.objects.get(pk=job.pk)), timeout=150, every=0.5
        )
    finally:
        fresh = Job.objects.get(pk=job.pk)
        print(f"{spec} job: {fresh.state} {fresh.reason} {fresh.message!r}")
        for attempt in fresh.attempts.all():
            print(f"  attempt {attempt.number}: {attempt.state} {attempt.backend_ref} {attempt.reason!r}")
            runner_out = Path(settings.TRAINYARD_STATE_ROOT) / str(job.pk) / f"attempt-{attempt.number}" / "runner.out"
            if runner_out.exists():
                print("  runner.out:", runner_out.read_text()[-2000:])
    text = _log(job)
    print(f"--- {spec} job log ---\n{text}")
    assert job.state == JobState.SUCCEEDED, text
    attempt = job.attempts.get()
    placed = [d["gpu_uuid"] for d in attempt.placement["devices"]]
    node = inventory.read_nvml()
    assert job.reproduce["emulated_gpus"] is False and job.reproduce["driver_version"] == node.driver_version
    visible = next(line for line in text.splitlines() if line.startswith("visible ")).split()
    assert visible[1] in {g.uuid for g in node.gpus} and visible[3] == "1"
    assert visible[1] == placed[0]  # the card the platform chose is the one CUDA saw
    card_line = next(line for line in text.splitlines() if line.startswith("card "))
    assert "NVIDIA" in card_line and visible[1].removeprefix("GPU-") in card_line
    limit = next(line for line in text.splitlines() if line.startswith("limit ")).split()[1]
    assert (limit != "none") is expect_limit


@pytest.mark.django_db(transaction=True)
def test_the_platform_probes_samples_and_exports_the_real_cards(platform, client):
    """The seeded node is the NVML one: the pre-placement probe passes on each card, a telemetry pass records a
    sample per card with what the card reports, and /metrics counts them as real (not emulated) healthy cards."""
    from cluster.models import GPU
    from monitoring import services as monitoring
    from monitoring.models import GpuSample

    cards = list(GPU.objects.select_related("node"))
    assert cards and not any(g.node.emulated for g in cards)
    report = monitoring.gpu_probe_all()
    assert (report.probed, report.failed) == (len(cards), 0)
    collected = monitoring.telemetry_collect()
    print("telemetry:", collected)
    assert collected.source == "nvml" and not collected.error and collected.samples == len(cards)
    for gpu in cards:
        sample = GpuSample.objects.filter(gpu=gpu).latest("at")
        assert sample.memory_total_mib == pytest.approx(gpu.memory_mib, abs=1)
        assert sample.temperature_c and sample.power_w and sample.utilization_pct is not None
    body = client.get("/metrics").content.decode()
    line = next(
        row
        for row in body.splitlines()
        if row.startswith("trainyard_gpus{")
        and 'emulated="false"' in row
        and 'health="healthy"' in row
        and 'quarantined="false"' in row
    )
    assert float(line.rsplit(" ", 1)[1]) == len(cards)


GREEDY_JOB = (
    "import sys, time, torch\n"
    "x = torch.empty(int(sys.argv[1]) * 1024 * 1024, dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize(); print('holding', sys.argv[1], 'MiB', flush=True); time.sleep(120)\n"
)


@needs_torch
@pytest.mark.django_db(transaction=True)
def test_a_shared_job_holding_more_than_its_share_is_stopped_by_the_platform(platform, celery_worker_thread):
    """A shared job (2/8 of the card) allocates 1.2x its share: the telemetry pass reads its real per-process
    memory through NVML, and the platform stops it as a user failure, without a retry."""
    from monitoring import services as monitoring

    card_mib = inventory.read_nvml().gpus[0].memory_mib
    share = card_mib * 2 // 8
    greedy = int(share * 1.2)
    job, _ = services.job_submit(
        user=platform,
        data={
            "team": "demo",
            "queue": "train",
            "spec": "shared",
            "image": "python-3.11",
            "max_retries": 2,
            "command": [JOB_PYTHON, "-c", GREEDY_JOB, str(greedy)],
        },
    )
    wait_for(lambda: "holding" in _log(job), timeout=150, every=0.5)
    report = monitoring.telemetry_collect()
    print("telemetry:", report)
    assert report.stopped == [f"{job.id}#1"]
    job = wait_for(lambda: (lambda j: j if j.is_terminal else None)(Job.objects.get(pk=job.pk)), timeout=60)
    attempt = job.attempts.get()
    event = job.events.get(kind="gpu_share_exceeded")
    print("stopped:", event.message, "|", attempt.reason, attempt.rule)
    assert job.state == JobState.FAILED and attempt.rule == "gpu-share-exceeded" and attempt.failure_class == "user"
    assert event.data["share_mib"] == share and event.data["used_mib"] >= greedy


# Right-sizing on a real card (docs/rightsizing.md): the profile comes from NVML's per-process memory and the card's
# utilization, sampled by the telemetry loop, not from anything the job states.
ALLOCATING_JOB = (
    "import sys, time, torch\n"
    "x = torch.empty(int(sys.argv[1]) * 1024 * 1024, dtype=torch.uint8, device='cuda')\n"
    "x.fill_(1); torch.cuda.synchronize(); print('holding', sys.argv[1], 'MiB', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def _profile_while_running(job, *, until, timeout: float):
    """Run the telemetry loop's two passes (card samples, then usage profiles) every second, as beat would,
    until `until(report)` is true; returns that report."""
    from monitoring import services as monitoring

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        monitoring.telemetry_collect()
        report = monitoring.usage_collect()
        if until(report):
            return report
        time.sleep(1.0)
    raise AssertionError(f"not reached in {timeout} s; job {Job.objects.get(pk=job.pk).state}")


@needs_torch
@pytest.mark.django_db(transaction=True)
def test_a_job_allocating_a_known_amount_is_profiled_within_5_percent_and_advised_next_time(
    platform, celery_worker_thread
):
    from monitoring import selectors
    from monitoring.models import UsageProfile

    card_mib = inventory.read_nvml().gpus[0].memory_mib
    if card_mib < 17 * 1024:
        pytest.skip(f"a {card_mib} MiB card: the CUDA context alone is more than 5% of what fits in 60% of it")
    amount = min(16384, card_mib * 6 // 10)  # large enough that the CUDA context (~0.5 GiB) stays within 5%
    command = [JOB_PYTHON, "-c", ALLOCATING_JOB, str(amount), "10"]
    data = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": command}
    job, _ = services.job_submit(user=platform, data=data)
    wait_for(lambda: "holding" in _log(job), timeout=150, every=0.5)
    _profile_while_running(job, until=lambda _: Job.objects.get(pk=job.pk).is_terminal, timeout=90)
    profile = wait_for(
        lambda: (
            _profile_while_running(job, until=lambda _: True, timeout=5)
            and UsageProfile.objects.filter(job=job, final=True).first()
        ),
        timeout=60,
    )
    print("profile:", profile.gpu_source, profile.gpu_memory_peak_mib, profile.gpu_util_p95_pct, "allocated", amount)
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    assert profile.gpu_source == "nvml"
    assert abs(profile.gpu_memory_peak_mib - amount) <= 0.05 * amount

    # The same command again: the answer carries a recommendation from that run; the request is untouched.
    again, _ = services.job_submit(user=platform, data=data)
    try:
        rec = selectors.recommendation_for(again)
        print("recommendation:", rec)
        assert rec is not None and rec["runs"] == 1 and rec["evidence"].startswith("1 run, peak")
        assert again.spec.name == "guaranteed" and again.gpu_memory_mib == job.gpu_memory_mib
    finally:
        lifecycle.job_cancel(job_id=str(again.id), actor="demo")


IDLE_CUDA_JOB = (
    "import time, torch\n"
    "x = torch.ones(256 * 1024 * 1024, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
    "print('idle', flush=True); time.sleep(300)\n"
)


@needs_torch
@pytest.mark.django_db(transaction=True)
def test_an_idle_job_on_a_real_card_is_flagged_then_stopped_after_its_notice(platform, celery_worker_thread):
    from monitoring.defaults import seed_rules
    from monitoring.models import AlertRule
    from quotas.models import Queue

    seed_rules(AlertRule)
    Queue.objects.filter(name="train").update(
        idle_threshold_pct=5, idle_after_s=5, idle_action="stop", idle_stop_after_s=5
    )
    data = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11"}
    job, _ = services.job_submit(user=platform, data={**data, "command": [JOB_PYTHON, "-c", IDLE_CUDA_JOB]})
    wait_for(lambda: "idle" in _log(job), timeout=150, every=0.5)
    flagged = _profile_while_running(job, until=lambda r: r.idle_flagged, timeout=60)
    assert flagged.idle_flagged == [f"{job.id}#1"]
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING  # noticed, not stopped yet
    assert job.events.filter(kind="gpu_idle").exists()
    stopped = _profile_while_running(job, until=lambda r: r.idle_stopped, timeout=60)
    assert stopped.idle_stopped == [f"{job.id}#1"]
    job = wait_for(lambda: (lambda j: j if j.is_terminal else None)(Job.objects.get(pk=job.pk)), timeout=60)
    assert job.state == JobState.CANCELLED and job.reason == "idle_gpu"
