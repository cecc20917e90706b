"""Smoke test of the embedded default: run by `make smoke-embedded` with no DATABASE_URL/REDIS_URL set."""

import os
from urllib.parse import urlparse

import pytest
import redis


@pytest.mark.django_db
def test_embedded_postgres_and_redis_serve_the_platform():
    if not os.environ.get("TRAINYARD_VAR_DIR"):
        pytest.skip("run through `make smoke-embedded` (embedded servers in a scratch var/)")
    from django.conf import settings

    from quotas.models import Team
    from trainyard.seed import seed

    assert urlparse(os.environ["DATABASE_URL"]).port != 5432, "expected the embedded PostgreSQL"
    seed(admin_password="smoke-admin-1", demo_password="smoke-demo-1")
    assert Team.objects.filter(slug="demo").exists()
    assert redis.Redis.from_url(settings.REDIS_URL).ping()
