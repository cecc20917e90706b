"""A waiting job's reason from its first second: the submission asks the dispatcher's own quota check
(`scheduler.quota_check`), so the job page, the API and the queue page agree before any pass has run, and a pass
that changes a reason tells the job's open page (which otherwise refreshes only on a change of state)."""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from jobs import services
from jobs.models import Job
from jobs.realtime import job_group
from jobs.states import JobState
from jobs.store import dispatch
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Queue, Team

pytestmark = pytest.mark.django_db(transaction=True)
ONE_CARD = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "timeout_s": 3600}


def _submit(user, **extra):
    return services.job_submit(user=user, data={**ONE_CARD, "command": ["python", "train.py"], **extra})[0]


def _running(user):
    job = _submit(user)
    dispatch(full=True)
    assert Job.objects.get(pk=job.pk).state == JobState.ADMITTED
    services.job_transition(job_id=job.id, to=JobState.STARTING, actor="test")
    services.job_transition(job_id=job.id, to=JobState.RUNNING, actor="test")
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=1))
    return job


def test_a_job_over_its_team_quota_says_so_before_any_pass(platform, client):  # noqa: F811
    Team.objects.filter(slug="demo").update(gpu_milli=1000, max_running_jobs=10, max_jobs_per_user=10)
    _running(platform)  # the team's one card is taken; three cards of the node are idle
    waiting = _submit(platform)  # no dispatch pass after this one (no worker runs in this test)
    job = Job.objects.get(pk=waiting.pk)
    assert job.state == JobState.PENDING and job.reason == "team_quota_exhausted", (job.reason, job.message)
    assert job.message.startswith("team demo has ") and "the job needs" in job.message, job.message
    assert job.events.filter(kind="waiting", data__reason="team_quota_exhausted").count() == 1
    client.force_login(platform)
    page = client.get(f"/jobs/{waiting.id}/").content.decode()
    header = page[page.index('class="job-summary"') :][:2500]
    assert "Your team&#x27;s quota is taken" in header, header
    assert "dispatcher is looking for GPUs" not in header
    queue_page = client.get("/queues/train/").content.decode()
    row = queue_page[queue_page.index(waiting.name) :][:1500]
    assert "Your team&#x27;s quota is taken" in row, row
    api = client.get(f"/api/v1/jobs/{waiting.id}/").json()
    assert api["reason"] == "team_quota_exhausted"
    # The pass agrees: nothing is rewritten, no second event.
    dispatch(full=True)
    job = Job.objects.get(pk=waiting.pk)
    assert job.reason == "team_quota_exhausted"
    assert job.events.filter(kind="waiting").count() == 1


def test_a_job_the_rules_let_through_says_the_dispatcher_looks_for_gpus(platform, client):  # noqa: F811
    waiting = _submit(platform)
    job = Job.objects.get(pk=waiting.pk)
    assert job.reason == "queued" and not job.events.filter(kind="waiting").exists()
    client.force_login(platform)
    page = client.get(f"/jobs/{waiting.id}/").content.decode()
    assert "the dispatcher is looking for GPUs" in page
    assert "nothing holds it back" not in page


def test_a_closed_queue_and_a_strict_fifo_line_say_so_at_once(platform):  # noqa: F811
    Queue.objects.filter(name="train").update(ordering="fifo", gpu_milli=1000)
    _running(platform)
    first = _submit(platform)  # the queue's one card is taken
    assert Job.objects.get(pk=first.pk).reason == "queue_quota_exhausted"
    Queue.objects.filter(name="train").update(gpu_milli=4000)
    Team.objects.filter(slug="demo").update(gpu_milli=1000)
    dispatch(full=True)
    assert Job.objects.get(pk=first.pk).reason == "team_quota_exhausted"
    Team.objects.filter(slug="demo").update(gpu_milli=4000)
    second = services.job_submit(
        user=platform, data={**ONE_CARD, "command": ["python", "train.py"], "spec": "shared", "gpus": 1}
    )[0]
    # The first job's last reason still stands until a pass: a strict FIFO line holds the second behind it.
    assert Job.objects.get(pk=second.pk).reason == "behind_earlier_job"
    Queue.objects.filter(name="train").update(state="closed")
    third = _submit(platform)
    assert Job.objects.get(pk=third.pk).reason == "queue_closed"


def test_a_pass_that_changes_a_reason_tells_the_jobs_page(platform):  # noqa: F811
    Queue.objects.filter(name="train").update(gpu_milli=10_000, gpu_memory_mib=10**7, cpu_milli=10**6, memory_mib=10**7)
    Team.objects.filter(slug="demo").update(gpu_milli=10_000, gpu_memory_mib=10**7, cpu_milli=10**6, memory_mib=10**7)
    waiting = _submit(platform, gpus=8)  # more cards than the node has, fewer than the quotas allow
    assert Job.objects.get(pk=waiting.pk).reason == "queued"
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(job_group(str(waiting.id)), channel)
    dispatch(full=True)
    reason = Job.objects.get(pk=waiting.pk).reason
    assert reason == "no_capacity", reason

    async def first():
        return await asyncio.wait_for(layer.receive(channel), 10)

    message = async_to_sync(first)()
    assert message == {"type": "job.state", "job_id": str(waiting.id), "state": "pending", "reason": "no_capacity"}


def test_a_strict_fifo_line_holds_a_new_job_only_behind_jobs_before_it(platform):  # noqa: F811
    """ "Before" is the line's order: preemptible last, then priority, then age. Each kind is its own index range
    (jobs.store._decided_ahead); a later, a lower or a preemptible job waiting with a reason holds nobody."""
    Queue.objects.filter(name="train").update(ordering="fifo", max_member_priority=100, allow_preemptible=True)
    Team.objects.filter(slug="demo").update(gpu_milli=10_000, gpu_memory_mib=10**7, cpu_milli=10**6, memory_mib=10**7)
    Queue.objects.filter(name="train").update(gpu_milli=10_000, gpu_memory_mib=10**7, cpu_milli=10**6, memory_mib=10**7)
    # A preemptible job of high priority waits with a reason a pass gave it (more cards than the node has).
    spare = _submit(platform, gpus=8, preemptible=True, priority=50)
    dispatch(full=True)
    assert Job.objects.get(pk=spare.pk).reason == "no_capacity"
    assert _submit(platform).reason == "queued"  # not behind a preemptible job, whatever its priority
    assert _submit(platform, preemptible=True, priority=60).reason == "queued"  # higher among the preemptible
    assert _submit(platform, preemptible=True, priority=50).reason == "behind_earlier_job"  # same, younger
    assert _submit(platform, preemptible=True, priority=10).reason == "behind_earlier_job"
    # A job of ordinary priority waits with a reason.
    Job.objects.filter(state=JobState.PENDING).update(state=JobState.CANCELLED, finished_at=timezone.now())
    held = _submit(platform, gpus=8)
    dispatch(full=True)
    assert Job.objects.get(pk=held.pk).reason == "no_capacity"
    assert _submit(platform, priority=1).reason == "queued"  # higher priority: before it
    assert _submit(platform, priority=-1).reason == "behind_earlier_job"
    assert _submit(platform).reason == "behind_earlier_job"  # same priority, younger
    assert _submit(platform, preemptible=True, priority=100).reason == "behind_earlier_job"  # any preemptible
