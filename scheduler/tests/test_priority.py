"""Priority classes and preemptible borrowing in the live dispatcher (real PostgreSQL, the real pass): inference
queues are admitted before training queues, preemptible jobs run beyond their queue's quota and are the first to
yield, and a quota-holding job that waits for cards preempts the youngest preemptible attempts it needs."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs import lifecycle, store
from jobs.models import Job, JobEvent
from jobs.preemption import preemptions_plan
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from kernel.errors import ValidationFailed
from quotas.models import Queue, ResourceSpec
from scheduler.tests.test_dispatch import GIB, fresh_pool, node, open_up, submit

pytestmark = pytest.mark.django_db(transaction=True)
A100 = "NVIDIA A100-SXM4-80GB"


def state(job: Job) -> tuple[str, str]:
    job = Job.objects.get(pk=job.pk)
    return job.state, job.reason


def dispatch() -> int:
    return store.dispatch().admitted


def test_inference_jumps_training_in_the_same_pool(platform):  # noqa: F811
    fresh_pool(node("n0", 2, A100))
    open_up("train")
    serve = Queue.objects.create(name="serve", priority=-50, priority_class=Queue.PriorityClass.INFERENCE)
    serve.teams.add(platform.teams.get())
    serve.specs.add(ResourceSpec.objects.get(name="guaranteed"))
    open_up("serve")
    running = [submit(platform) for _ in range(2)]
    assert dispatch() == 2
    training = submit(platform)
    inference = submit(platform, queue="serve")  # later, and its queue's own priority is lower
    dispatch()
    assert state(training)[0] == state(inference)[0] == "pending"
    lifecycle.job_cancel(job_id=running[0].id, actor="demo")  # never started: its card is free at once
    assert dispatch() == 1
    assert state(inference)[0] == "admitted"
    assert state(training) == ("pending", "no_capacity")


def test_preemptible_jobs_borrow_beyond_the_quota_and_the_owner_takes_the_cards_back(platform):  # noqa: F811
    fresh_pool(node("n0", 4, A100))
    open_up("train")
    open_up("distributed")
    one_card = {"gpu_milli": 1000, "gpu_memory_mib": 80 * GIB}
    Queue.objects.filter(name="train").update(**one_card, allow_preemptible=True)
    guaranteed = submit(platform)
    borrowers = [submit(platform, preemptible=True) for _ in range(3)]
    assert dispatch() == 4  # one within the queue's one-card quota, three beyond it
    assert all(state(j)[0] == "admitted" for j in [guaranteed, *borrowers])
    # The no-borrowing rule still holds for everything else: a second quota-holding job waits on the quota ...
    over = submit(platform)
    dispatch()
    assert state(over) == ("pending", "queue_quota_exhausted")
    assert preemptions_plan() == []  # ... and preempts nobody: it has no quota to take back
    lifecycle.job_cancel(job_id=over.id, actor="demo")

    # The distributed queue's job holds quota and waits for two cards: the two youngest borrowers yield them.
    owner = submit(platform, queue="distributed", gpus=2)
    dispatch()
    assert [state(j) for j in borrowers[1:]] == [("pending", "queued")] * 2
    assert state(borrowers[0])[0] == "admitted"
    for job in borrowers[1:]:
        attempt = Job.objects.get(pk=job.pk).attempts.get()
        assert attempt.state == "preempted" and attempt.preempt_requested_at is not None
        event = JobEvent.objects.get(job=job, kind="preemption")
        assert event.data["for_job"] == str(owner.id) and event.data["for_queue"] == "distributed"
        assert event.data["for_team"] == "demo" and event.data["for_owner"] == "demo"
        assert Job.objects.get(pk=job.pk).retries_used == 0
    assert dispatch() == 1
    assert state(owner)[0] == "admitted"
    assert [state(j) for j in borrowers[1:]] == [("pending", "no_capacity")] * 2
    assert preemptions_plan() == []  # a waiting preemptible job never preempts


def test_preemptible_is_refused_where_the_queue_does_not_take_it(platform):  # noqa: F811
    with pytest.raises(ValidationFailed) as refused:
        submit(platform, preemptible=True)
    assert refused.value.code == "preemptible_not_allowed" and refused.value.field == "preemptible"
    client = APIClient()
    client.force_authenticate(platform)
    body = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    answer = client.post("/api/v1/jobs/", {**body, "preemptible": True}, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "preemptible_not_allowed", answer.content
    Queue.objects.filter(name="train").update(allow_preemptible=True)
    made = client.post("/api/v1/jobs/", {**body, "preemptible": True}, format="json")
    assert made.status_code == 201 and made.json()["preemptible"] is True
    assert client.post("/api/v1/jobs/", {**body, "preemptible": "maybe"}, format="json").status_code == 400


def test_the_attempts_of_one_pass_are_numbered_in_the_order_it_admitted_them(platform):  # noqa: F811
    """Preemption takes the youngest attempts first (created at, then id): within one pass's write, where every
    attempt has the same time, the ids must follow the line, whatever join order the planner picks (the jobs are
    locked in id order, and uuids sort in no particular order)."""
    from django.db import connection

    fresh_pool(node("n0", 8, A100))
    open_up("train")
    jobs = [submit(platform) for _ in range(8)]
    with connection.cursor() as cursor:  # a merge join: its output follows the jobs' uuids
        cursor.execute("SET enable_nestloop = off")
        cursor.execute("SET enable_hashjoin = off")
    try:
        assert dispatch() == 8
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_nestloop")
            cursor.execute("RESET enable_hashjoin")
    attempts = [Job.objects.get(pk=job.pk).attempts.get().id for job in jobs]
    assert attempts == sorted(attempts)
