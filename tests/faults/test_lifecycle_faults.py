"""Faults in the lifecycle against real processes and the real database: lost start messages, a start that
died half way, starts that race, a supervisor killed with SIGKILL, processes that escape their session, and the
bad inputs (output floods, closed stdout, a thousand children). Each ends in one recorded state with nothing held.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.db import connection

from jobs import lifecycle, logstore
from jobs.backends import get_backend
from jobs.models import Attempt, Job
from kernel import proctree
from tests.faults.conftest import assert_settled, drive_once, drive_until, runs, settled, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]


def admitted_attempt(job) -> Attempt:
    from jobs import tasks

    tasks.dispatch_all()
    return Attempt.objects.get(job=job, state="placed")


def test_an_admitted_job_whose_start_message_was_lost_is_started_by_the_reconciler(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="echo done", marks=marks)
    admitted_attempt(job)  # admitted; the start message sits in a queue no worker reads
    assert Job.objects.get(pk=job.pk).state == "admitted"
    report = lifecycle.lifecycle_reconcile()
    assert report["started"] == 1
    drive_until(lambda: settled(job))
    assert_settled(job, marks, state="succeeded")
    assert runs(marks) == ["1"]


def test_a_start_that_died_after_the_backend_accepted_it_is_adopted_not_run_again(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="sleep 1", marks=marks)
    attempt = admitted_attempt(job)
    # The first two steps of a start, then the worker "dies": the hand-over to the database never happens.
    claimed = lifecycle._attempt_claim(attempt_id=attempt.id)
    ref = get_backend().submit(lifecycle.describe_attempt(claimed))
    attempt.refresh_from_db()
    assert attempt.state == "starting" and attempt.backend_ref == ""
    lifecycle.attempt_start(attempt_id=attempt.id)  # a redelivered message
    lifecycle.lifecycle_reconcile()  # and the reconciler, both at once
    attempt.refresh_from_db()
    assert attempt.backend_ref == ref
    drive_until(lambda: settled(job))
    assert_settled(job, marks, state="succeeded")
    assert runs(marks) == ["1"]


def test_concurrent_starts_of_one_attempt_run_it_once(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="sleep 1", marks=marks)
    attempt = admitted_attempt(job)
    errors = []

    def start() -> None:
        try:
            lifecycle.attempt_start(attempt_id=attempt.id)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    drive_until(lambda: settled(job))
    assert_settled(job, marks, state="succeeded")
    assert runs(marks) == ["1"]


def test_two_submits_of_one_attempt_at_the_same_instant_run_it_once(platform, fast_lifecycle, tmp_path, monkeypatch):
    """The reconciler starts again an attempt claimed and not handed over after TRAINYARD_START_OVERDUE_S, while
    the first start may still be in the backend's submit (seen in the fault suite on a loaded machine: both wrote
    the same spec file, the second rename failed, the attempt was retried while the first start's command ran, so
    the command ran twice). Four submits at once: none fails, they take turns (never two writing the attempt's
    folder together), one supervisor runs the command once."""
    import jobs.backends.local as local

    marks = tmp_path / "marks"
    job = submit(platform, script="sleep 1", marks=marks)
    attempt = admitted_attempt(job)
    desc = lifecycle.describe_attempt(lifecycle._attempt_claim(attempt_id=attempt.id))
    starts, inside, most = 4, [0], [0]
    guard = threading.Lock()
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):  # the spec's rename, held open long enough for a second writer to meet it
        if str(dst).endswith("spec.json"):
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.3)
            with guard:
                inside[0] -= 1
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(local.os, "replace", replace)
    refs, errors = [], []
    go = threading.Barrier(starts)

    def start() -> None:
        try:
            go.wait(timeout=30)
            refs.append(get_backend().submit(desc))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(starts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.undo()
    assert errors == [] and refs == [refs[0]] * starts
    assert most[0] == 1  # one start wrote the spec; the others waited, then found its supervisor
    lifecycle.attempt_start(attempt_id=attempt.id)  # the hand-over, as the surviving start records it
    drive_until(lambda: settled(job))
    assert_settled(job, marks, state="succeeded")
    assert runs(marks) == ["1"]
    assert Attempt.objects.filter(job=job).count() == 1


def test_a_killed_supervisor_is_fenced_before_the_retry(platform, fast_lifecycle, tmp_path):
    """SIGKILL to the supervisor only: its escaped grandchild must be dead before attempt 2 starts."""
    marks = tmp_path / "marks"
    ticks = tmp_path / "ticks"
    script = (
        'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then '
        f"setsid sh -c 'while :; do echo \"$TRAINYARD_ATTEMPT $(date +%s%N)\" >> {ticks}; sleep 0.05; done' & "
        "sleep 300; else date +%s%N > " + str(tmp_path / "second") + "; fi"
    )
    job = submit(platform, script=script, marks=marks)
    drive_until(lambda: Job.objects.get(pk=job.pk).state == "running")
    drive_until(lambda: ticks.exists())
    folder = get_backend()._folder(Attempt.objects.get(job=job, number=1).backend_ref)
    os.kill(int((folder / "runner.pid").read_text()), signal.SIGKILL)
    drive_until(lambda: settled(job))
    job = assert_settled(job, marks, state="succeeded")
    first, second = job.attempts.order_by("number")
    assert first.state == "lost" and first.failure_class == "platform"
    assert second.state == "succeeded"
    second_started = int((tmp_path / "second").read_text())
    last_tick = max(int(line.split()[1]) for line in ticks.read_text().splitlines())
    assert last_tick < second_started, "attempt 1's process still ran when attempt 2 started"
    assert runs(marks) == ["1", "2"]


def test_cancel_kills_a_child_that_left_the_session_and_ignores_sigterm(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    # Double fork: the escaped child is orphaned at once, in a session of its own, and ignores SIGTERM.
    job = submit(platform, script="(setsid sh -c 'trap \"\" TERM; sleep 300' &); sleep 300", marks=marks)
    drive_until(lambda: Job.objects.get(pk=job.pk).state == "running")
    drive_until(lambda: len(proctree.tagged(str(job.id), 1)) >= 3)
    started = time.monotonic()
    lifecycle.job_cancel(job_id=job.id, actor="test")
    drive_until(lambda: settled(job), timeout=30)
    assert time.monotonic() - started < fast_lifecycle.TRAINYARD_CANCEL_GRACE_S + 10
    assert_settled(job, marks, state="cancelled")


def test_a_main_process_that_exits_while_a_child_holds_stdout_ends_the_attempt(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="(sleep 300; echo never) & echo main done; exit 0", marks=marks)
    started = time.monotonic()
    drive_until(lambda: settled(job), timeout=30)
    assert time.monotonic() - started < 20
    job = assert_settled(job, marks, state="succeeded")
    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), 1))
    assert [line.text for line in lines] == ["main done"]


def test_ended_at_is_when_the_process_ended_not_when_it_was_noticed(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="exit 0", marks=marks)
    lifecycle.attempt_start(attempt_id=admitted_attempt(job).id)
    time.sleep(3)  # nobody observes for a while
    drive_until(lambda: settled(job))
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    finished = Job.objects.get(pk=job.pk)
    # The job's own times are its attempt's, not the moment the observer noticed (3 s later).
    event = finished.events.filter(kind="state", to_state="succeeded").get()
    assert (event.at - attempt.ended_at).total_seconds() > 2
    assert finished.finished_at == attempt.ended_at
    assert finished.started_at is not None and finished.started_at <= finished.finished_at
    assert_settled(job, marks, state="succeeded")


def test_a_flood_without_newlines_is_kept_in_bounded_lines(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="head -c 3000000 /dev/zero | tr '\\0' x", marks=marks)
    drive_until(lambda: settled(job), timeout=60)
    job = assert_settled(job, marks, state="succeeded")
    folder = logstore.attempt_dir(str(job.id), 1)
    lines, _ = logstore.read_lines(folder, limit=10_000)
    assert len(lines) == 3000000 // logstore.MAX_LINE_BYTES + 1
    assert all(len(line.text.encode()) <= logstore.MAX_LINE_BYTES + 20 for line in lines)


def test_a_job_that_closes_stdout_early_and_runs_on_ends_with_its_own_status(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="echo before; exec >&- 2>&-; sleep 2; exit 3", marks=marks, max_retries=0)
    drive_until(lambda: settled(job), timeout=30)
    job = assert_settled(job, marks, state="failed")
    assert job.attempts.get().exit_code == 3


def test_a_thousand_children_left_behind_are_all_stopped(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    script = "i=0; while [ $i -lt 1000 ]; do sleep 300 & i=$((i+1)); done; echo forked; exit 0"
    job = submit(platform, script=script, marks=marks)
    drive_until(lambda: settled(job), timeout=120)
    job = assert_settled(job, marks, state="succeeded")
    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), 1))
    assert [line.text for line in lines] == ["forked"]


def test_an_unwritable_log_folder_degrades_logging_and_the_job_runs_on(platform, fast_lifecycle, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the log root should be")
    fast_lifecycle.TRAINYARD_LOG_ROOT = blocker / "logs"
    marks = tmp_path / "marks"
    job = submit(platform, script="for i in $(seq 1 50); do echo line $i; done", marks=marks)
    drive_until(lambda: settled(job), timeout=30)
    job = assert_settled(job, marks, state="succeeded")
    event = job.events.get(kind="logs_degraded")
    assert event.level == "warning" and event.data["lines_lost"] == 50
    assert "NotADirectoryError" in event.data["error"]


def test_a_full_disk_degrades_logging_and_the_job_runs_on(platform, fast_lifecycle, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs /dev/full (a device whose writes fail with ENOSPC)")
    marks = tmp_path / "marks"
    job = submit(platform, script="for i in $(seq 1 3000); do echo line $i; done; sleep 1", marks=marks)
    folder = logstore.attempt_dir(str(job.id), 1)
    folder.mkdir(parents=True)
    (folder / "log").symlink_to("/dev/full")  # every flush of the log fails as on a full disk
    drive_until(lambda: settled(job), timeout=30)
    job = assert_settled(job, marks, state="succeeded")
    event = job.events.get(kind="logs_degraded")
    assert event.data["lines_lost"] == 3000 and "No space left" in event.data["error"]


def test_reconciler_stops_a_cancel_that_was_never_delivered(platform, fast_lifecycle, tmp_path):
    """The stop message is lost (cancel recorded, backend never told): past the grace the reconciler repeats it."""
    marks = tmp_path / "marks"
    job = submit(platform, script="sleep 300", marks=marks)
    drive_until(lambda: Job.objects.get(pk=job.pk).state == "running")
    from jobs.services import job_transition

    job_transition(job_id=job.id, to="cancelling", actor="test", reason="cancelled_by_user")  # no stop sent
    time.sleep(0.5)
    assert Job.objects.get(pk=job.pk).state == "cancelling"
    drive_until(lambda: settled(job), timeout=30)
    assert_settled(job, marks, state="cancelled")


def test_a_job_never_has_two_live_attempts(platform, fast_lifecycle, tmp_path):
    from django.db import IntegrityError

    job = submit(platform, script="sleep 1", marks=tmp_path / "marks")
    attempt = admitted_attempt(job)
    with pytest.raises(IntegrityError):
        Attempt.objects.create(job=job, number=attempt.number + 1, backend="local")
    drive_until(lambda: settled(job))
    assert_settled(job, state="succeeded")


def test_drive_once_is_quiet_with_nothing_to_do(platform, fast_lifecycle):
    drive_once()
    assert lifecycle.lifecycle_reconcile() == {"started": 0, "stopped": 0, "observed": 0}


def test_a_cancel_that_lands_while_the_start_is_in_flight_stops_what_was_started(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="sleep 300", marks=marks)
    attempt = admitted_attempt(job)
    lifecycle._attempt_claim(attempt_id=attempt.id)  # a worker claimed the start...
    assert lifecycle.job_cancel(job_id=job.id, actor="test").state == "cancelling"  # ...the user cancels...
    lifecycle.attempt_start(attempt_id=attempt.id)  # ...and the start goes through: the hand-over stops it
    drive_until(lambda: settled(job), timeout=30)
    assert_settled(job, marks, state="cancelled")


def test_a_cancel_before_the_start_means_it_never_runs(platform, fast_lifecycle, tmp_path):
    marks = tmp_path / "marks"
    job = submit(platform, script="sleep 300", marks=marks)
    attempt = admitted_attempt(job)
    assert lifecycle.job_cancel(job_id=job.id, actor="test").state == "cancelled"
    lifecycle.attempt_start(attempt_id=attempt.id)  # the start message arrives late
    drive_once()
    assert_settled(job, marks, state="cancelled")
    assert runs(marks) == [] and not (get_backend().root / str(job.id)).exists()


def test_a_start_is_not_overdue_before_its_time(platform, settings, tmp_path):
    settings.TRAINYARD_START_OVERDUE_S = 600
    job = submit(platform, script="echo hi", marks=tmp_path / "marks")
    admitted_attempt(job)
    assert lifecycle.lifecycle_reconcile()["started"] == 0
    assert Job.objects.get(pk=job.pk).state == "admitted"
    settings.TRAINYARD_START_OVERDUE_S = 0
    assert lifecycle.lifecycle_reconcile()["started"] == 1
    drive_until(lambda: settled(job))
    assert_settled(job, state="succeeded")


def test_one_unreadable_attempt_folder_never_blinds_the_observer_to_the_others(platform, fast_lifecycle, tmp_path):
    """An attempt whose state files cannot be read (here `status.json` is a folder: every read is an OSError) is
    reported on that job alone; a bystander that ended is recorded at once; once the fault outlasts
    TRAINYARD_OBSERVE_FAILING_S the broken attempt is fenced and retried as a platform failure."""
    from jobs.models import JobEvent

    stuck_marks, ok_marks = tmp_path / "stuck", tmp_path / "ok"
    stuck = submit(
        platform,
        script='if [ "$TRAINYARD_ATTEMPT" = 1 ]; then sleep 300; else echo second; fi',
        marks=stuck_marks,
    )
    drive_until(lambda: Job.objects.get(pk=stuck.pk).state == "running")
    attempt = Attempt.objects.get(job=stuck, number=1)
    folder = get_backend()._folder(attempt.backend_ref)
    (folder / "status.json").mkdir()
    bystander = submit(platform, script="echo done", marks=ok_marks)
    fast_lifecycle.TRAINYARD_OBSERVE_FAILING_S = 3600
    drive_until(lambda: settled(bystander), timeout=60)
    assert_settled(bystander, ok_marks, state="succeeded")
    assert Job.objects.get(pk=stuck.pk).state == "running"
    warned = JobEvent.objects.filter(job=stuck, kind="observe_failing")
    assert warned.count() == 1 and "cannot be read or written" in warned.get().message
    assert proctree.tagged(str(stuck.id), 1), "the broken attempt's processes were stopped too early"
    # The fault persists past the limit: the attempt's processes are stopped and it is retried.
    fast_lifecycle.TRAINYARD_OBSERVE_FAILING_S = 0
    drive_until(lambda: settled(stuck), timeout=90)
    (folder / "status.json").rmdir()
    job = assert_settled(stuck, stuck_marks, state="succeeded")
    first, second = job.attempts.order_by("number")
    assert (first.state, first.reason, first.failure_class) == ("lost", "ObserveFailed", "platform")
    assert second.state == "succeeded"
    assert runs(stuck_marks) == ["1", "2"]
