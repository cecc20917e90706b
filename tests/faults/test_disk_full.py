"""A job that fills its own disk, on a real small filesystem (a size-limited tmpfs mounted for the test).

The attempt's state files (spec, lock, status) live under TRAINYARD_STATE_ROOT, apart from the job's work and
checkpoint folders: a full work disk ends the attempt with a recorded outcome — a finished command is never run
again, a command left running on it is stopped as `DiskFull`, and a cancel completes.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from jobs import lifecycle
from jobs.backends import reset_backends
from jobs.models import Job, JobEvent
from tests.faults.conftest import assert_settled, drive_until, runs, settled, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]

DISK_MIB = 8
FILL = f'dd if=/dev/zero of="%s" bs=1M count={DISK_MIB * 4} 2>/dev/null || true; echo filled'


@pytest.fixture
def small_disk(fast_lifecycle, tmp_path):
    """An 8 MiB tmpfs holding the jobs' work and checkpoint folders (TRAINYARD_WORK_ROOT)."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the disk-full tests mount a tmpfs and need root")
        pytest.skip("the disk-full tests mount a tmpfs and need root")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m,mode=0700", "tmpfs", str(mount)], check=True)
    fast_lifecycle.TRAINYARD_WORK_ROOT = mount / "work"
    fast_lifecycle.TRAINYARD_DISK_FULL_GRACE_S = 2.0
    reset_backends()
    yield mount
    reset_backends()
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_job_that_fills_its_checkpoint_disk_and_exits_0_is_recorded_once_not_rerun(platform, small_disk, tmp_path):
    """Before: status.json shared the full filesystem, the supervisor died writing it, and the run was `lost`
    and started again (filling the disk again)."""
    marks = tmp_path / "marks"
    job = submit(platform, script=FILL % "$TRAINYARD_CHECKPOINT_DIR/big.ckpt" + "; exit 0", marks=marks)
    drive_until(lambda: settled(job), timeout=60)
    job = assert_settled(job, marks, state="succeeded")
    assert runs(marks) == ["1"]
    assert job.attempts.get().exit_code == 0
    assert _free(small_disk) < 1 << 20, "the job did not fill its disk: the test proves nothing"


def test_a_job_left_running_on_a_full_work_disk_ends_disk_full_and_is_not_retried(platform, small_disk, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script=FILL % "fill" + "; sleep 300", marks=marks)
    started = time.monotonic()
    drive_until(lambda: settled(job), timeout=60)
    took = time.monotonic() - started
    job = assert_settled(job, marks, state="failed")
    attempt = job.attempts.get()
    assert (attempt.reason, attempt.rule, attempt.failure_class) == ("DiskFull", "disk-full", "resource")
    assert "full disk" in job.message and "MiB free of 8.0 MiB" in job.message, job.message
    assert runs(marks) == ["1"]
    event = JobEvent.objects.get(job=job, kind="disk_full")
    assert event.level == "warning" and event.data["free_bytes"] < 1 << 20
    assert event.data["total_bytes"] == DISK_MIB << 20
    assert took < 30, f"stopped {took:.1f} s after submission (grace 2 s)"


def test_a_cancel_completes_while_the_work_disk_is_full(platform, small_disk, fast_lifecycle, tmp_path):
    """The cancel reaches the supervisor and its outcome is recorded as the supervisor saw it (before: the status
    could not be written on the full disk, and the attempt was recorded `Lost` once its supervisor had died)."""
    fast_lifecycle.TRAINYARD_DISK_FULL_GRACE_S = 3600.0  # the job keeps running on its full disk until cancelled
    reset_backends()
    marks = tmp_path / "marks"
    job = submit(platform, script=FILL % "fill" + "; sleep 300", marks=marks)
    drive_until(lambda: Job.objects.get(pk=job.pk).state == "running" and _free(small_disk) < 1 << 20, timeout=60)
    started = time.monotonic()
    lifecycle.job_cancel(job_id=job.id, actor="test")
    drive_until(lambda: settled(job), timeout=30)
    assert time.monotonic() - started < fast_lifecycle.TRAINYARD_CANCEL_GRACE_S + 10
    job = assert_settled(job, marks, state="cancelled")
    assert runs(marks) == ["1"]
    attempt = job.attempts.get()
    assert (attempt.state, attempt.reason, attempt.signal) == ("cancelled", "SIGTERM", 15)


def test_state_files_on_the_full_disk_too_are_kept_by_the_reserve(platform, small_disk, fast_lifecycle, tmp_path):
    """Misconfigured: the state root on the very filesystem the job fills. The state folder's preallocated reserve
    is given up to write status.json, so the finished run is still recorded once."""
    fast_lifecycle.TRAINYARD_STATE_ROOT = small_disk / "state"
    reset_backends()
    marks = tmp_path / "marks"
    job = submit(platform, script=FILL % "fill" + "; exit 0", marks=marks)
    drive_until(lambda: settled(job), timeout=60)
    job = assert_settled(job, marks, state="succeeded")
    assert runs(marks) == ["1"]
    folder = small_disk / "state" / str(job.id) / "attempt-1"
    assert (folder / "status.json").stat().st_size > 0 and not (folder / "reserve").exists()
