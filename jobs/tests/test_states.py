"""The transition table, walked pair by pair through the one function that moves a job."""

import pytest
from django.utils import timezone

from jobs import services
from jobs.models import Job, JobEvent
from jobs.states import ALLOWED, TERMINAL, JobState

pytestmark = pytest.mark.django_db

PAIRS = [(a, b) for a in JobState.values for b in JobState.values]


@pytest.fixture
def job(settings):
    from django.contrib.auth import get_user_model

    from ops.seed import seed

    settings.TRAINYARD_LOCAL_GPUS = "2x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    demo = get_user_model().objects.get(username="demo")
    job, _ = services.job_submit(
        user=demo,
        data={"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]},
    )
    return job


def _put(job, state):
    Job.objects.filter(pk=job.pk).update(
        state=state,
        finished_at=timezone.now() if state in TERMINAL else None,
        reserved=state in {"admitted", "starting", "running", "cancelling"},
    )


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_every_pair(job, source, target):
    _put(job, source)
    events_before = JobEvent.objects.filter(job=job).count()
    if source == target:
        assert services.job_transition(job_id=job.id, to=target, actor="test").state == source
        assert JobEvent.objects.filter(job=job).count() == events_before  # a no-op writes nothing
    elif target in ALLOWED[source]:
        moved = services.job_transition(job_id=job.id, to=target, actor="test")
        assert moved.state == target
        assert (moved.finished_at is not None) == (target in TERMINAL)
        event = JobEvent.objects.filter(job=job).latest("id")
        assert (event.from_state, event.to_state) == (source, target)
        if target in TERMINAL or target == JobState.RETRYING:
            assert not moved.reserved  # reservations are given back on the way out
    else:
        with pytest.raises(services.InvalidTransition):
            services.job_transition(job_id=job.id, to=target, actor="test")
        job.refresh_from_db()
        assert job.state == source
        assert JobEvent.objects.filter(job=job).count() == events_before


def test_terminal_states_are_final():
    assert all(not ALLOWED[state] for state in TERMINAL)
    assert set(ALLOWED) == set(JobState.values)


def test_database_refuses_a_terminal_state_without_finished_at(job):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(state="succeeded", finished_at=None)
