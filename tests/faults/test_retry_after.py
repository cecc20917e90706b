"""Every 503 the platform answers says when to come back (`Retry-After`). The walk finds each place the product
code answers 503 and checks that it sets the header (or is a DomainError, which the one handler gives it); the
ones that had none are driven for real here: a checkpoint download while the object store is down, and /readyz
while Redis is.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from kernel.paths import BASE_DIR
from ops import embedded

pytestmark = [pytest.mark.faults]

PRODUCT = ["cluster", "experiments", "frontend", "images", "jobs", "kernel", "monitoring", "ops", "quotas", "scheduler",
           "trainyard"]  # fmt: skip
ANSWERS_503 = re.compile(r"status(_code)?\s*=\s*(503|status\.HTTP_503)|else 503|http_status\s*=\s*503")


def _answers() -> list[tuple[Path, int, str]]:
    found = []
    for package in PRODUCT:
        for path in (BASE_DIR / package).rglob("*.py"):
            if "tests" in path.parts or "migrations" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if ANSWERS_503.search(line) and not line.lstrip().startswith("#"):
                    found.append((path, number, line))
    return found


def test_every_503_the_code_answers_carries_retry_after():
    answers = _answers()
    assert len(answers) >= 6, answers  # the walk sees them: outage handler, server_error, store, readyz, TensorBoard
    missing = []
    for path, number, line in answers:
        lines = path.read_text().splitlines()
        if "http_status" in line:
            handler = (BASE_DIR / "kernel" / "errors.py").read_text()
            assert "if exc.http_status == 503 else None" in handler  # the one handler adds the header
            continue
        near = "\n".join(lines[max(0, number - 6) : number + 8])
        if "Retry-After" not in near:
            missing.append(f"{path.relative_to(BASE_DIR)}:{number}: {line.strip()}")
    assert not missing, missing


@pytest.mark.django_db(transaction=True)
def test_checkpoint_download_while_the_store_is_down_is_a_503_with_retry_after(platform, settings):
    from jobs.models import Attempt, Checkpoint
    from jobs.services import job_submit
    from quotas.tokens import token_create

    job, _ = job_submit(user=platform, data={"team": "demo", "queue": "train", "spec": "shared",
                                             "image": "python-3.11", "command": ["true"]})  # fmt: skip
    attempt = Attempt.objects.create(job=job, number=1)
    checkpoint = Checkpoint.objects.create(
        job=job, attempt=attempt, name="ckpt-1.pt", sha256="0" * 64, bucket="trainyard", key="x/ckpt-1.pt",
        files=[{"path": "ckpt-1.pt", "key": "x/ckpt-1.pt", "size": 1, "sha256": "0" * 64}], saved_at=timezone.now(),
    )  # fmt: skip
    settings.TRAINYARD_S3_URL = f"http://127.0.0.1:{embedded.free_port()}"  # nothing listens there
    settings.TRAINYARD_S3_ACCESS_KEY_ID = settings.TRAINYARD_S3_SECRET_ACCESS_KEY = "unused"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_create(user=platform, name='store')[1]}")
    response = client.get(f"/api/v1/jobs/{job.id}/checkpoints/{checkpoint.pk}/download/")
    assert response.status_code == 503, response.content
    assert response.json()["code"] == "object_store_unavailable"
    assert int(response["Retry-After"]) > 0


@pytest.mark.django_db(transaction=True)
def test_readyz_while_redis_is_down_is_a_503_with_retry_after(settings, client):
    settings.REDIS_URL = f"redis://127.0.0.1:{embedded.free_port()}/0"  # nothing listens there
    settings.TRAINYARD_READY_TIMEOUT = 0.5
    response = client.get("/readyz")
    assert response.status_code == 503, response.content
    assert "redis" in response.json()["failed"]
    assert int(response["Retry-After"]) > 0
