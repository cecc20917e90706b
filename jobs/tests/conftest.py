"""Fixtures for lifecycle tests: a seeded platform on an emulated GPU node, real processes, a real worker."""

import time

import pytest

from jobs import lifecycle
from jobs.backends import reset_backends


@pytest.fixture
def platform(settings, tmp_path, transactional_db):
    """Seeded queues/specs/team, an emulated 4x24GiB node, logs and work dirs under tmp_path."""
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    settings.TRAINYARD_WORK_ROOT = tmp_path / "work"
    settings.TRAINYARD_STATE_ROOT = tmp_path / "state"
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    settings.TRAINYARD_CODE_ROOT = tmp_path / "code"
    settings.TRAINYARD_EMULATED_FAULTS_FILE = str(tmp_path / "faults.json")
    settings.TRAINYARD_CANCEL_GRACE_S = 2.0
    reset_backends()
    from django.contrib.auth import get_user_model

    from ops.seed import seed

    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    yield get_user_model().objects.get(username="demo")
    _kill_leftovers(tmp_path / "state")
    reset_backends()


def _kill_leftovers(root):
    import json
    import os
    import signal

    for child in root.glob("*/attempt-*/child.json"):
        try:
            os.killpg(json.loads(child.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError, KeyError):
            pass


def wait_for(predicate, *, timeout=30.0, every=0.1, observe=True):
    """Poll (running the observe pass the beat would run) until predicate() is truthy."""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if observe:
            lifecycle.attempts_observe()
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


# What a registry would have resolved the seeded external bases to: the seed itself claims no digest (nobody pulled
# them), but a Kubernetes job must name `repo@sha256:…`, and these tests have no route to those registries.
TEST_DIGESTS = {
    "pytorch-2.5-cuda12.4": "sha256:" + "1" * 64,
    "pytorch-2.1-cuda11.8": "sha256:" + "2" * 64,
    "tensorflow-2.16-cuda12.3": "sha256:" + "3" * 64,
    "python-3.11": "sha256:" + "4" * 64,
}


def pin_catalog() -> None:
    """Give the seeded bases the digests a registry lookup would have found (tests on the volcano backend)."""
    from images.models import BaseImage

    for name, digest in TEST_DIGESTS.items():
        BaseImage.objects.filter(name=name, digest="").update(digest=digest)
