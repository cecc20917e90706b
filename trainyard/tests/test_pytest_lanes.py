"""The test runs that share one PostgreSQL, Redis and object store are kept apart (ops/pytest_workers.py): the
xdist workers of the bulk suite, and a whole second run named by TRAINYARD_TEST_LANE (the real-cluster tests on a
second Kubernetes/Volcano pair, run beside the first by scripts/test.sh)."""

import os
import subprocess
import sys

import pytest

from kernel.paths import BASE_DIR
from ops.pytest_workers import _worker_redis_url, lane_environment


def test_a_lane_gets_its_own_redis_database_postgres_database_and_bucket():
    base = {
        "REDIS_URL": "redis://:secret@127.0.0.1:6390/0",
        "DATABASE_URL": "postgres://postgres:pw@127.0.0.1:5440/trainyard",
        "TRAINYARD_S3_BUCKET": "trainyard",
    }
    one, two = lane_environment(base, "1"), lane_environment(base, "2")
    assert one == {
        "REDIS_URL": "redis://:secret@127.0.0.1:6390/5",
        "DATABASE_URL": "postgres://postgres:pw@127.0.0.1:5440/trainyard_lane1",
        "TRAINYARD_S3_BUCKET": "trainyard-lane1",
    }
    assert two["REDIS_URL"].endswith("/6") and two["DATABASE_URL"].endswith("/trainyard_lane2")
    # never a Redis database of the bulk suite's workers (the configured one plus 1, 2)
    workers = {_worker_redis_url(base["REDIS_URL"], f"gw{n}") for n in range(2)}
    assert workers == {"redis://:secret@127.0.0.1:6390/1", "redis://:secret@127.0.0.1:6390/2"}
    assert not workers & {lane_environment(base, str(n))["REDIS_URL"] for n in range(1, 5)}


def test_the_defaults_are_the_settings_own_when_nothing_is_configured():
    assert lane_environment({}, "3") == {
        "REDIS_URL": "redis://127.0.0.1:6379/7",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/trainyard_lane3",
        "TRAINYARD_S3_BUCKET": "trainyard-lane3",
    }


@pytest.mark.parametrize("lane", ["0", "5", "x", "-1"])
def test_a_lane_outside_one_to_four_is_refused_by_name(lane):
    with pytest.raises(ValueError, match="TRAINYARD_TEST_LANE must be one of 1-4"):
        lane_environment({}, lane)


def test_a_pytest_run_in_a_lane_reads_the_lanes_settings():
    """The plugin changes the environment before the settings are read: in a lane, the Django settings of the
    run name the lane's database, Redis database and bucket."""
    probe = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.DATABASES['default']['NAME'], settings.REDIS_URL.rsplit('/', 1)[1], "
        "settings.TRAINYARD_S3_BUCKET)"
    )
    env = {**os.environ, "TRAINYARD_TEST_LANE": "2", "DJANGO_SETTINGS_MODULE": "trainyard.settings"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("TRAINYARD_S3_BUCKET", None)
    env["REDIS_URL"] = "redis://127.0.0.1:6379/0"
    env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/trainyard"
    done = subprocess.run(
        [sys.executable, "-c", f"import ops.pytest_workers; {probe}"],
        env=env, cwd=BASE_DIR, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["trainyard_lane2", "6", "trainyard-lane2"]
