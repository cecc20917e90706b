"""What a new user sees on a freshly seeded platform (`manage.py seed`, as `make run` does it)."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from jobs import services, store
from jobs.backends import reset_backends
from jobs.states import JobState, PendingReason
from quotas.models import Queue, Team


@pytest.mark.django_db
def test_the_seeded_demo_team_is_smaller_than_the_queue_so_its_third_job_waits_on_the_team(settings, tmp_path):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    settings.TRAINYARD_WORK_ROOT = tmp_path / "work"
    settings.TRAINYARD_STATE_ROOT = tmp_path / "state"
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    reset_backends()
    call_command("seed", stdout=open("/dev/null", "w"))  # noqa: SIM115 - the command's report is not the test's
    team, train = Team.objects.get(slug="demo"), Queue.objects.get(name="train")
    assert team.gpu_milli == 2000 and train.gpu_milli == 4000
    demo = get_user_model().objects.get(username="demo")
    jobs = [
        services.job_submit(
            user=demo,
            data={
                "team": "demo",
                "queue": "train",
                "spec": "guaranteed",
                "image": "python-3.11",
                "command": "sleep 60",
            },
        )[0]
        for _ in range(3)
    ]
    store.dispatch(queue_ids=[train.id])
    states = [(j.state, j.reason) for j in (type(j).objects.get(pk=j.pk) for j in jobs)]
    assert states[:2] == [(JobState.ADMITTED, states[0][1])] * 2
    assert states[2] == (JobState.PENDING, PendingReason.TEAM_QUOTA_EXHAUSTED)
    reset_backends()
