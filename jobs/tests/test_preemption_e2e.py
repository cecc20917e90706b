"""Preemption end to end: real sandboxed local jobs, a real worker running the dispatcher, a real S3 store.

A preemptible job borrows every card; a quota-holding job of another queue arrives and needs one. The borrower
gets its notice (SIGTERM, TRAINYARD_PREEMPT_NOTICE from its start), saves and syncs a last checkpoint, ends
`preempted` (no retry used), the owner's job runs, and the borrower resumes from its checkpoint afterwards.
"""

import time

import pytest

from jobs.models import Attempt, Checkpoint, Job, JobEvent
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from jobs.tests.test_lifecycle_e2e import finished, log_text, reload, submit
from quotas.models import Queue

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Trains until told to yield; on the notice it saves its step and stops. A resumed attempt reads it back.
BORROWER = r"""
echo "attempt=$TRAINYARD_ATTEMPT notice=${TRAINYARD_PREEMPT_NOTICE:-none} resume=${TRAINYARD_RESUME_FROM:-none}"
if [ -n "$TRAINYARD_RESUME_FROM" ]; then echo "restored: $(cat "$TRAINYARD_RESUME_FROM")"; exit 0; fi
step=0
save() { printf "weights-at-step-$step" > "$TRAINYARD_CHECKPOINT_DIR/ckpt-$step.pt"; echo "saved step $step"; }
trap 'save; exit 143' TERM
while true; do step=$((step + 1)); sleep 0.2; done
"""

# Ignores the notice: only SIGKILL after the grace stops it.
STUBBORN = "trap '' TERM; echo notice=$TRAINYARD_PREEMPT_NOTICE; while true; do sleep 0.2; done"


def _borrow_everything(platform, command):
    Queue.objects.filter(name="train").update(allow_preemptible=True)
    borrower = submit(platform, spec="guaranteed", gpus=4, preemptible=True, max_retries=0, command=command)
    wait_for(lambda: reload(borrower).state == JobState.RUNNING, timeout=60)
    return borrower


def test_preempted_job_saves_a_checkpoint_yields_and_resumes_after_the_owner_ran(
    platform, celery_worker_thread, checkpoint_store, settings
):
    settings.TRAINYARD_PREEMPT_GRACE_S = 20
    borrower = _borrow_everything(platform, ["sh", "-c", BORROWER])
    time.sleep(0.5)  # a few steps
    owner = submit(platform, queue="distributed", spec="guaranteed", gpus=1, command=["sh", "-c", "echo mine; sleep 1"])

    owner = wait_for(lambda: finished(owner), timeout=90)
    assert owner.state == JobState.SUCCEEDED, log_text(owner)
    borrower = wait_for(lambda: finished(borrower), timeout=90)
    assert borrower.state == JobState.SUCCEEDED, log_text(borrower, 2)

    first, second = Attempt.objects.filter(job=borrower).order_by("number")
    assert first.state == "preempted" and first.reason == "Preempted" and first.preempt_requested_at
    assert first.signal != 9, (first.exit_code, first.signal)  # it stopped on the notice, not killed
    assert borrower.retries_used == 0 and borrower.max_retries == 0  # no retry used
    first_log = log_text(borrower, 1)
    assert "attempt=1 notice=20 resume=none" in first_log and "saved step" in first_log
    step = int(first_log.split("saved step ")[1].split()[0])
    # The final sync saved the checkpoint written on the notice; attempt 2 started from it.
    saved = Checkpoint.objects.get(job=borrower, attempt=first)
    assert saved.name == f"ckpt-{step}.pt" and saved.step == step
    assert f"restored: weights-at-step-{step}" in log_text(borrower, 2)
    # Who needed the cards, recorded on the preempted job; the owner was admitted before the borrower came back.
    event = JobEvent.objects.get(job=borrower, kind="preemption")
    assert event.data["for_job"] == str(owner.id) and event.data["for_queue"] == "distributed"
    assert event.attempt_id == first.id and event.data["grace_s"] == 20
    assert owner.admitted_at < second.created_at
    states = [s for s in borrower.events.values_list("to_state", flat=True) if s]
    assert "retrying" in states and states.count("pending") == 2 and "failed" not in states


def test_a_job_that_ignores_the_notice_is_killed_after_the_grace(platform, celery_worker_thread, settings):
    settings.TRAINYARD_PREEMPT_GRACE_S = 2
    borrower = _borrow_everything(platform, ["sh", "-c", STUBBORN])
    owner = submit(platform, queue="distributed", spec="guaranteed", gpus=1, command=["sh", "-c", "sleep 30"])
    wait_for(lambda: reload(owner).state in (JobState.STARTING, JobState.RUNNING), timeout=60)
    attempt = Attempt.objects.get(job=borrower, number=1)
    assert attempt.state == "preempted" and attempt.signal == 9, (attempt.exit_code, attempt.signal)
    assert (attempt.ended_at - attempt.preempt_requested_at).total_seconds() >= 1.5
    assert "notice=2" in log_text(borrower, 1)
    job = Job.objects.get(pk=borrower.pk)
    assert job.state == JobState.PENDING and job.retries_used == 0
