"""Fixtures for portal tests: a seeded platform with the demo team and a second team the demo user is not in."""

from types import SimpleNamespace

import pytest
from django.test import Client

from frontend.tests.browser import live_portal, observer, page, platform  # noqa: F401 - the browser tests' fixtures
from jobs import services
from jobs.backends import reset_backends
from ops.seed import seed
from quotas.models import Queue
from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory


@pytest.fixture
def portal(db, settings, tmp_path):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    settings.TRAINYARD_WORK_ROOT = tmp_path / "work"
    settings.TRAINYARD_STATE_ROOT = tmp_path / "state"
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    reset_backends()
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    from django.contrib.auth import get_user_model

    other_team = TeamFactory(slug="vision", name="Vision team")
    for queue in Queue.objects.all():
        queue.teams.add(other_team)
    outsider = UserFactory(username="olga")
    MembershipFactory(team=other_team, user=outsider)
    yield SimpleNamespace(demo=get_user_model().objects.get(username="demo"), outsider=outsider, other_team=other_team)
    reset_backends()


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def submit(user, **overrides):
    data = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": ["python", "train.py"],
        "env": {"EPOCHS": "3"},
    }
    data.update(overrides)
    job, _created = services.job_submit(user=user, data=data)
    return job


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so a fixture can tell whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report
