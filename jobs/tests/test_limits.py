"""Local jobs get what they asked for, no more: memory, processes and CPU held by the kernel (kernel/limits.py),
and in root mode a seccomp filter with no user namespaces (kernel/seccomp.py). Real sandboxed jobs through the
real local backend, on whatever this machine allows (cgroup v2, v1 or rlimits: each test says what it needs)."""

import json
import os
import sys
from pathlib import Path

import pytest
from django.conf import settings

from jobs import lifecycle, logstore, services
from jobs.backends import local, sandbox
from jobs.models import Job
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from kernel import limits
from kernel.host import platform_scope
from quotas.models import ResourceSpec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MEMORY_MIB = 128
CPU_MILLI = 500


def _need_sandbox() -> None:
    try:
        sandbox.preflight(settings.TRAINYARD_SANDBOX_BWRAP)
    except sandbox.SandboxUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the limits suite: {exc}")
        pytest.skip(str(exc))


def _need_cgroups() -> str:
    mode = limits.detect("auto")
    if mode == "rlimit":
        pytest.skip("no control group can be made here (not root, or no cgroup hierarchy): limits are rlimits")
    return mode


@pytest.fixture
def small(platform, celery_worker_thread, settings):
    """The shared spec shrunk to 128 MiB and half a CPU, with the sandbox on."""
    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    settings.TRAINYARD_JOB_LIMITS = "auto"
    ResourceSpec.objects.filter(name="shared").update(memory_mib_per_gpu=MEMORY_MIB, cpu_milli_per_gpu=CPU_MILLI)
    return platform


def _submit(user, command):
    job, _ = services.job_submit(
        user=user,
        data={"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": command,
              "max_retries": 2},
    )  # fmt: skip
    return job


def _finished(job: Job) -> Job | None:
    fresh = Job.objects.get(pk=job.pk)
    return fresh if fresh.is_terminal else None


def _log(job: Job) -> str:
    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), 1))
    return "\n".join(line.text for line in lines)


def _status(job: Job) -> dict:
    return json.loads((Path(settings.TRAINYARD_STATE_ROOT) / str(job.id) / "attempt-1" / "status.json").read_text())


def _held(job: Job) -> str:
    return json.loads((Path(settings.TRAINYARD_STATE_ROOT) / str(job.id) / "attempt-1" / "limits.json").read_text())[
        "held"
    ]


def test_a_job_past_its_memory_is_killed_and_reported_out_of_memory_with_its_peak(small):
    mode = _need_cgroups()
    job = _submit(small, [sys.executable, "-c", "s = b'x' * (400 << 20); print('allocated', len(s))"])
    done = wait_for(lambda: _finished(job), timeout=60)
    log = _log(done)
    attempt = done.attempts.get(number=1)
    assert done.state == JobState.FAILED, log
    assert (attempt.reason, attempt.failure_class, attempt.reaction) == ("OOMKilled", "user", "no_retry"), log
    assert done.attempts.count() == 1  # an out-of-memory kill is the user's: never retried
    held = _held(done)
    assert f"limits: memory {MEMORY_MIB} MiB" in held and f"({mode})" in held
    assert "allocated" not in log
    status = _status(done)
    peak = status["memory_peak_bytes"]
    # The peak is the limit it hit (give or take the kernel's accounting granularity), far below the 400 MiB asked.
    assert (MEMORY_MIB - 8) << 20 <= peak <= MEMORY_MIB << 20, status
    assert status["limits"]["oom_kills"] >= 1 and status["limits"]["mode"] == mode
    failed = done.events.get(kind="attempt_failed")
    assert f"out of memory: killed at its memory limit of {MEMORY_MIB} MiB, peak {peak >> 20} MiB" in failed.message
    assert "larger" in done.suggestion.lower() or done.suggestion  # the OOM rule's advice reaches the user


FORKS = r"""
import os, sys, time
started = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError as exc:
        print("fork refused:", exc.strerror, flush=True)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    started += 1
print("started", started, flush=True)
"""


def test_a_fork_bomb_stops_at_the_process_limit(small, settings):
    """Forks until the kernel says no (bounded at 300 so this test can never take the machine down)."""
    settings.TRAINYARD_JOB_PIDS_MAX = 40
    if _need_cgroups() == "rlimit" and os.geteuid() != 0:
        pytest.skip("rlimits hold processes only when each job has its own uid (root mode)")
    job = _submit(small, [sys.executable, "-c", FORKS])
    done = wait_for(lambda: _finished(job), timeout=60)
    log = _log(done)
    assert done.state == JobState.SUCCEEDED, log
    started = int(log.split("started ", 1)[1].split()[0])
    assert "fork refused: Resource temporarily unavailable" in log
    assert 20 < started < 40, log  # bwrap's init, the command itself, and the forks share the 40
    assert "40 processes" in _held(done)
    assert _status(done)["limits"]["forks_refused"] >= 1


def test_the_cpu_quota_is_set_and_holds(small):
    mode = _need_cgroups()
    script = (
        "import os, time, multiprocessing as mp\n"
        "def burn():\n"
        "    end = time.monotonic() + 1.5\n"
        "    while time.monotonic() < end: pass\n"
        "ps = [mp.Process(target=burn) for _ in range(2)]\n"
        "[p.start() for p in ps]; [p.join() for p in ps]\n"
        "t = os.times(); print('cpu', t.children_user + t.children_system, flush=True)\n"
        "time.sleep(30)\n"
    )
    job = _submit(small, [sys.executable, "-c", script])
    wait_for(lambda: "cpu " in _log(job) if Job.objects.get(pk=job.pk).attempts.exists() else False, timeout=60)
    child = json.loads((Path(settings.TRAINYARD_STATE_ROOT) / str(job.id) / "attempt-1" / "child.json").read_text())
    groups = dict(line.split(":", 2)[1:] for line in Path(f"/proc/{child['pid']}/cgroup").read_text().splitlines())
    if mode == "cgroup2":
        folder = Path("/sys/fs/cgroup") / groups[""].strip("/")
        assert (folder / "cpu.max").read_text().split() == ["50000", "100000"]
        assert int((folder / "memory.max").read_text()) == MEMORY_MIB << 20
        assert (folder / "pids.max").read_text().strip() == str(settings.TRAINYARD_JOB_PIDS_MAX)
    else:
        cpu = (
            Path(limits._mounts()["cpu"]) / groups["cpu,cpuacct"].strip("/")
            if "cpu,cpuacct" in groups
            else (Path(limits._mounts()["cpu"]) / groups["cpu"].strip("/"))
        )
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        memory = Path(limits._mounts()["memory"]) / groups["memory"].strip("/")
        assert int((memory / "memory.limit_in_bytes").read_text()) == MEMORY_MIB << 20
    used = float(_log(job).split("cpu ", 1)[1].split()[0])
    # Two busy processes for 1.5 s of wall time: about 3 CPU-seconds unlimited, at most about 0.75 s at half a CPU.
    assert used < 1.2, _log(job)
    lifecycle.job_cancel(job_id=job.id, actor="test")
    wait_for(lambda: _finished(job), timeout=30)
    assert not folder.exists() if mode == "cgroup2" else not memory.exists()  # removed with the attempt


def test_without_control_groups_memory_is_held_per_process_by_rlimits(small, settings):
    settings.TRAINYARD_JOB_LIMITS = "rlimit"
    job = _submit(small, [sys.executable, "-c", "s = b'x' * (400 << 20); print('allocated', len(s))"])
    done = wait_for(lambda: _finished(job), timeout=60)
    log = _log(done)
    assert done.state == JobState.FAILED, log
    assert "MemoryError" in log and "allocated" not in log
    assert "rlimit; CPU not limited" in _held(done)
    assert _status(done)["limits"]["mode"] == "rlimit"
    assert local.runtime()["limits"] == "rlimit"


def test_root_mode_jobs_cannot_make_user_namespaces(small):
    if os.geteuid() != 0:
        pytest.skip("root mode only: unprivileged, bubblewrap's --disable-userns holds instead")
    keyring = (
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
        "print('keyctl', libc.syscall(250, 0, 0, 0, 0, 0), os.strerror(ctypes.get_errno()))"
    )
    script = f'unshare -U true; echo unshare=$?; "{sys.executable}" -c "{keyring}"; echo done'
    job = _submit(small, ["sh", "-c", script])
    done = wait_for(lambda: _finished(job), timeout=60)
    log = _log(done)
    assert done.state == JobState.SUCCEEDED, log
    assert "unshare=0" not in log and "unshare=" in log, log
    assert "Operation not permitted" in log
    if os.uname().machine == "x86_64":  # 250 is keyctl there
        assert "keyctl -1 Operation not permitted" in log, log
    assert local.runtime()["seccomp"] is True


def test_a_killed_supervisors_cgroups_are_removed_once_its_attempt_is_fenced(small):
    import signal

    from jobs.models import Attempt

    _need_cgroups()
    job = _submit(small, ["sh", "-c", "echo up; sleep 300"])
    wait_for(lambda: "up" in _log(job) if Job.objects.get(pk=job.pk).attempts.exists() else False, timeout=60)
    folder = Path(settings.TRAINYARD_STATE_ROOT) / str(job.id) / "attempt-1"
    groups = [Path(p) for p in json.loads((folder / "limits.json").read_text())["folders"]]
    assert groups and all(g.is_dir() for g in groups)
    # Named with this platform's scope: another platform on the host has a job of this number too.
    assert all(g.name == f"{platform_scope()}-{job.id}-1" for g in groups), groups
    os.kill(int((folder / "runner.pid").read_text()), signal.SIGKILL)
    wait_for(lambda: Attempt.objects.get(job=job, number=1).state == "lost", timeout=60)
    assert not any(g.exists() for g in groups)
    lifecycle.job_cancel(job_id=job.id, actor="test")
    wait_for(lambda: _finished(job), timeout=60)


def test_another_platforms_attempt_of_the_same_numbers_is_not_this_ones(monkeypatch):
    """Two platforms on one host (a `make run` beside a test run, two CI lanes) both have job 1, attempt 1 and build
    1: the scope in each tag and group name keeps one from finding, reusing or killing the other's processes."""
    import subprocess
    import time

    from django.db import connections

    from kernel import proctree

    mine = platform_scope()
    assert len(mine) == 8 and int(mine, 16) >= 0
    tag = {**os.environ, "TRAINYARD_JOB_ID": "424242", "TRAINYARD_ATTEMPT": "1"}
    other = subprocess.Popen(["sleep", "60"], env={**tag, "TRAINYARD_PLATFORM_SCOPE": "0badc0de"})
    own = subprocess.Popen(["sleep", "60"], env={**tag, "TRAINYARD_PLATFORM_SCOPE": mine})
    older = subprocess.Popen(["sleep", "60"], env=tag)  # started before attempts carried a scope
    try:
        deadline = time.monotonic() + 10
        while len(proctree.tagged("424242", 1)) < 3:
            assert time.monotonic() < deadline, "the three processes did not start"
            time.sleep(0.02)
        assert proctree.tagged("424242", 1, mine) == {own.pid, older.pid}
        assert proctree.tagged("424242", 1, "0badc0de") == {other.pid, older.pid}
        assert proctree.tagged("424242", 1) == {own.pid, older.pid, other.pid}
    finally:
        for proc in (other, own, older):
            proc.kill()
            proc.wait()
    plan = limits.plan(memory_mib=64, cpu_milli=0, pids_max=0, scope=mine)
    assert limits.AttemptLimits(plan, name="424242-1").name == f"{mine}-424242-1"
    assert limits.AttemptLimits({**plan, "scope": ""}, name="424242-1").name == "424242-1"
    # Another database (another platform's ids) is another scope.
    monkeypatch.setitem(connections["default"].settings_dict, "NAME", "another_platform")
    assert platform_scope() != mine
