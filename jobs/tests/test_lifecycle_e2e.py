"""End to end with real processes and a real Celery worker: the local backend runs every job."""

import json
import os
import sys
import threading

import pytest
from django.db import connection

from cluster.models import GPU, LogicalDevice, PoolRepair
from jobs import lifecycle, logstore, selectors, services, store
from jobs.models import Attempt, Job
from jobs.states import JobState
from jobs.tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def submit(user, **overrides):
    data = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": ["sh", "-c", "echo hello from $TRAINYARD_JOB_ID; echo gpus=$CUDA_VISIBLE_DEVICES"],
    }
    data.update(overrides)
    job, created = services.job_submit(user=user, data=data)
    assert created
    return job


def reload(job):
    return Job.objects.get(pk=job.pk)


def finished(job):
    fresh = reload(job)
    return fresh if fresh.is_terminal else None


def log_text(job, attempt=1):
    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), attempt))
    return "\n".join(line.text for line in lines)


def active_slices():
    return LogicalDevice.objects.filter(released_at__isnull=True)


def test_job_succeeds_with_its_placement_in_the_environment(platform, celery_worker_thread):
    job = submit(
        platform,
        spec="shared",
        command=[
            "sh",
            "-c",
            "echo limit=$CUDA_DEVICE_MEMORY_LIMIT sm=$CUDA_DEVICE_SM_LIMIT attempt=$TRAINYARD_ATTEMPT; sleep 1",
        ],
    )
    job = wait_for(lambda: finished(job))
    assert job.state == JobState.SUCCEEDED
    assert "limit=6144m sm=25 attempt=1" in log_text(job)
    # The local backend ran the command on the host, not in the image: the record says so, with what did run.
    record = job.reproduce
    assert record["image_used"] is False and record["image_digest"] is None and record["image_reference"] is None
    assert record["image_requested"] == {"reference": job.image_reference, "digest": ""}  # never pulled: unresolved
    assert record["runtime"]["kind"] == "host" and record["runtime"]["python"] == sys.executable
    assert record["runtime"]["path"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert job.reproduce["driver_version"] and job.reproduce["emulated_gpus"] is True
    assert not active_slices().exists()
    kinds = list(job.events.values_list("to_state", flat=True))
    # A job can end between two observe passes; then it goes from starting straight to succeeded.
    assert [k for k in kinds if k] in (
        ["pending", "admitted", "starting", "running", "succeeded"],
        ["pending", "admitted", "starting", "succeeded"],
    )


def test_python_in_a_local_job_is_the_platforms_own_interpreter(platform, celery_worker_thread):
    job = submit(platform, command=["python", "-c", "import sys; print('ran', sys.executable, sys.version_info[:2])"])
    job = wait_for(lambda: finished(job))
    assert job.state == JobState.SUCCEEDED, log_text(job)
    assert f"ran {sys.executable} {tuple(sys.version_info[:2])}" in log_text(job)


def test_user_error_fails_without_retry(platform, celery_worker_thread):
    job = submit(platform, command=["sh", "-c", "echo bad input >&2; exit 1"], max_retries=3)
    job = wait_for(lambda: finished(job))
    assert job.state == JobState.FAILED
    assert job.failure_class == "user"
    attempts = list(job.attempts.all())
    assert len(attempts) == 1 and attempts[0].exit_code == 1 and attempts[0].rule == "user-exit-1-2"


def test_a_users_own_unknown_exit_code_is_the_users_and_not_retried(platform, celery_worker_thread):
    job = submit(platform, command=["python3", "-c", "import sys; print('giving up'); sys.exit(3)"], max_retries=2)
    job = wait_for(lambda: finished(job))
    assert job.state == JobState.FAILED and job.failure_class == "user" and job.exit_code == 3
    attempt = job.attempts.get()  # one attempt: nothing retried
    assert (attempt.rule, attempt.reaction) == ("user-exit", "no_retry")
    assert "non-zero code of its own" in job.suggestion
    assert not job.events.filter(to_state=JobState.RETRYING).exists()


def test_cuda_oom_in_log_is_a_user_failure_with_a_suggestion(platform, celery_worker_thread):
    job = submit(platform, command=["sh", "-c", "echo 'RuntimeError: CUDA out of memory. Tried to allocate'; exit 3"])
    job = wait_for(lambda: finished(job))
    assert job.state == JobState.FAILED and job.failure_class == "user"
    assert "larger spec" in job.suggestion
    assert job.attempts.get().rule == "cuda-out-of-memory"


def test_platform_kill_is_retried_on_another_gpu_then_succeeds(platform, celery_worker_thread):
    script = 'if [ "$TRAINYARD_ATTEMPT" = "1" ]; then kill -9 $$; fi; echo recovered'
    job = submit(platform, spec="guaranteed", command=["sh", "-c", script], max_retries=2)
    job = wait_for(lambda: finished(job))
    assert job.state == JobState.SUCCEEDED
    first, second = job.attempts.order_by("number")
    assert first.failure_class == "platform" and first.signal == 9 and first.reaction == "retry_elsewhere"
    assert first.placement["devices"][0]["gpu_uuid"] != second.placement["devices"][0]["gpu_uuid"]
    assert "recovered" in log_text(job, attempt=2)


def test_timeout_stops_the_job_and_frees_the_gpu(platform, celery_worker_thread):
    job = submit(platform, command=["sleep", "60"], timeout_s=1)
    wait_for(lambda: reload(job).state == JobState.RUNNING)
    import time

    time.sleep(1.2)
    assert lifecycle.timeouts_enforce() == 1
    job = wait_for(lambda: finished(job))
    assert job.state == JobState.TIMED_OUT
    assert job.attempts.get().state == "timed_out"
    assert not active_slices().exists()


def test_cancel_while_pending_and_while_running(platform, celery_worker_thread):
    from quotas.models import Queue

    Queue.objects.filter(name="debug").update(state="closed")
    waiting = submit(platform, queue="debug")
    wait_for(lambda: reload(waiting).reason == "queue_closed", observe=False)
    assert lifecycle.job_cancel(job_id=waiting.id, actor="demo").state == JobState.CANCELLED

    running = submit(platform, command=["sh", "-c", "trap '' TERM; sleep 60"])
    wait_for(lambda: reload(running).state == JobState.RUNNING)
    assert lifecycle.job_cancel(job_id=running.id, actor="demo").state == JobState.CANCELLING
    job = wait_for(lambda: finished(running), timeout=20)
    assert job.state == JobState.CANCELLED  # SIGTERM ignored: SIGKILL after the grace period
    assert not active_slices().exists()
    with pytest.raises(services.InvalidTransition):
        services.job_transition(job_id=running.id, to=JobState.RUNNING, actor="test")


def test_concurrent_submissions_never_over_admit(platform):
    """50 submissions and concurrent dispatchers against a team quota of 2 whole GPUs."""
    from quotas.models import Team

    Team.objects.filter(slug="demo").update(gpu_milli=2000, max_jobs_per_user=100, max_running_jobs=100)
    jobs, errors = [], []

    def submit_one(i):
        try:
            jobs.append(submit(platform, spec="guaranteed", name=f"burst-{i}", command=["sleep", "30"]))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit_one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(jobs) == 50
    from quotas.models import Queue

    queue_id = Queue.objects.get(name="train").id

    def dispatch():
        try:
            store.dispatch(queue_ids=[queue_id])
        finally:
            connection.close()

    dispatchers = [threading.Thread(target=dispatch) for _ in range(8)]
    for t in dispatchers:
        t.start()
    for t in dispatchers:
        t.join()
    assert Job.objects.filter(reserved=True).count() == 2
    assert Job.objects.filter(state=JobState.ADMITTED).count() == 2
    assert active_slices().filter(exclusive=True).count() == 2
    assert len(set(active_slices().values_list("gpu_id", flat=True))) == 2
    waiting = Job.objects.filter(state=JobState.PENDING)
    assert waiting.count() == 48
    assert set(waiting.values_list("reason", flat=True)) <= {"team_quota_exhausted", "behind_earlier_job"}
    assert sorted(selectors.queue_positions(waiting.values_list("id", flat=True)).values()) == list(range(1, 49))


def test_reconcile_frees_a_planted_leak(platform):
    gpu = GPU.objects.first()
    LogicalDevice.objects.create(gpu=gpu, attempt=None, compute_milli=250, memory_mib=6144)
    report = services_reconcile()
    assert report.freed == 1
    assert not active_slices().exists()
    assert PoolRepair.objects.filter(kind="freed_leaked_slice", gpu=gpu).exists()


def services_reconcile():
    from cluster.services import pool_reconcile

    return pool_reconcile(live_backend_refs=set())


def test_exclusive_handout_reclaims_a_stale_slice(platform, settings):
    """A slice left behind by a finished debug job must not shrink a later exclusive job's card."""
    settings.TRAINYARD_LOCAL_GPUS = "1x24GiB"
    from cluster.inventory import emulated_node
    from cluster.services import inventory_sync

    GPU.objects.all().delete()
    inventory_sync(info=emulated_node("1x24GiB"))
    gpu = GPU.objects.get()
    debug = submit(platform, queue="debug", spec="shared", command=["true"])
    lifecycle.job_cancel(job_id=debug.id, actor="test")
    stale_attempt = Attempt.objects.create(
        job=debug, number=1, backend="local", state="succeeded", ended_at=debug.submitted_at
    )
    stale = LogicalDevice.objects.create(gpu=gpu, attempt=stale_attempt, compute_milli=250, memory_mib=6144)
    exclusive = submit(platform, spec="guaranteed", command=["true"])
    from quotas.models import Queue

    store.dispatch(queue_ids=[Queue.objects.get(name="train").id])
    exclusive = reload(exclusive)
    assert exclusive.state == JobState.ADMITTED
    device = exclusive.attempts.get().slices.get()
    assert device.exclusive and device.memory_mib == 24 * 1024 and device.compute_milli == 1000
    stale.refresh_from_db()
    assert stale.released_at is not None and stale.release_reason == "reclaimed_for_exclusive"


def test_failed_probe_falls_through_to_the_next_gpu(platform, settings, tmp_path):
    first = GPU.objects.order_by("index").first()
    (tmp_path / "faults.json").write_text(json.dumps([first.uuid]))
    job = submit(platform, spec="guaranteed", command=["true"])
    from quotas.models import Queue

    store.dispatch(queue_ids=[Queue.objects.get(name="train").id])
    device = reload(job).attempts.get().slices.get()
    assert device.gpu_id != first.id
    first.refresh_from_db()
    assert first.health == "suspect"


def test_shares_pack_onto_the_card_that_fragments_least(platform):
    """A 3/4 share fills the card a 1/4 share already uses, keeping the other cards whole for exclusive jobs."""
    from quotas.models import Queue

    train = Queue.objects.get(name="train").id
    small = submit(platform, spec="shared", command=["true"])
    store.dispatch(queue_ids=[train])
    first_gpu = reload(small).attempts.get().slices.get().gpu_id
    big = submit(platform, spec="performance", command=["true"])
    store.dispatch(queue_ids=[train])
    assert reload(big).attempts.get().slices.get().gpu_id == first_gpu
    whole = submit(platform, spec="guaranteed", command=["true"])
    store.dispatch(queue_ids=[train])
    assert reload(whole).attempts.get().slices.get().gpu_id != first_gpu
