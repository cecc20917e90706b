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

    from ops.seed import seed
    from quotas.models import Team

    assert urlparse(os.environ["DATABASE_URL"]).port != 5432, "expected the embedded PostgreSQL"
    seed(admin_password="smoke-admin-1", demo_password="smoke-demo-1")
    assert Team.objects.filter(slug="demo").exists()
    assert redis.Redis.from_url(settings.REDIS_URL).ping()


def test_embedded_servers_want_their_generated_passwords():
    if not os.environ.get("TRAINYARD_VAR_DIR"):
        pytest.skip("run through `make smoke-embedded` (embedded servers in a scratch var/)")
    import stat
    from pathlib import Path

    import psycopg

    var = Path(os.environ["TRAINYARD_VAR_DIR"])
    assert stat.S_IMODE(var.stat().st_mode) & 0o066 == 0  # others may at most pass through (the server's own user)
    for name in ["postgres.password", "redis.password", "redis.conf", "secret_key"]:
        assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name
    pg, rd = urlparse(os.environ["DATABASE_URL"]), urlparse(os.environ["REDIS_URL"])
    assert pg.password == (var / "postgres.password").read_text().strip()
    assert rd.password == (var / "redis.password").read_text().strip()
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(f"postgresql://postgres@{pg.hostname}:{pg.port}/trainyard", connect_timeout=5)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(f"postgresql://postgres:wrong@{pg.hostname}:{pg.port}/trainyard", connect_timeout=5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host=rd.hostname, port=rd.port).ping()
    hba = (var / "pgdata" / "pg_hba.conf").read_text().splitlines()
    assert not [line for line in hba if line.strip() and not line.startswith("#") and line.split()[-1] == "trust"]


def test_embedded_object_store_wants_its_generated_keys():
    if not os.environ.get("TRAINYARD_VAR_DIR"):
        pytest.skip("run through `make smoke-embedded` (embedded servers in a scratch var/)")
    import stat
    from pathlib import Path

    from kernel import objectstore

    var = Path(os.environ["TRAINYARD_VAR_DIR"])
    for name in ["s3.password", "s3.json"]:
        assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name
    assert urlparse(os.environ["TRAINYARD_S3_URL"]).hostname == "127.0.0.1"
    key, _, secret = (var / "s3.password").read_text().strip().partition(":")
    assert (os.environ["TRAINYARD_S3_ACCESS_KEY_ID"], os.environ["TRAINYARD_S3_SECRET_ACCESS_KEY"]) == (key, secret)
    store = objectstore.S3Config.from_env()
    s3 = objectstore.client(store)
    s3.put_object(Bucket=store.bucket, Key="smoke/hello", Body=b"hi")
    assert s3.get_object(Bucket=store.bucket, Key="smoke/hello")["Body"].read() == b"hi"
    wrong = objectstore.S3Config(url=store.url, bucket=store.bucket, access_key_id=key, secret_access_key="wrong")
    with pytest.raises(objectstore.StoreError):
        objectstore.ensure_bucket(wrong)
    assert (var / "seaweedfs" / "volume").is_dir()


def test_embedded_registry_serves_the_distribution_api():
    if not os.environ.get("TRAINYARD_VAR_DIR"):
        pytest.skip("run through `make smoke-embedded` (embedded servers in a scratch var/)")
    import stat
    from pathlib import Path

    import httpx

    from ops import embedded

    if embedded.registry_binary() is None and os.environ.get("CI") != "true":
        pytest.skip("docker-registry is not installed: no embedded image registry")
    var = Path(os.environ["TRAINYARD_VAR_DIR"])
    url = os.environ["TRAINYARD_REGISTRY_URL"]
    assert urlparse(url).hostname == "127.0.0.1"
    assert httpx.get(f"{url}/v2/", timeout=5).status_code == 401  # anonymous: refused
    user, _, password = (var / "registry.password").read_text().strip().partition(":")
    assert (os.environ["TRAINYARD_REGISTRY_USERNAME"], os.environ["TRAINYARD_REGISTRY_PASSWORD"]) == (user, password)
    assert os.environ["TRAINYARD_REGISTRY_TOKEN_KEY"] == str(var / "registry-token.key")
    from images import registry

    with registry.Client(url) as client:  # the platform's credential, through the token service the registry names
        client.ping()
        assert client.token
    for name in ["registry.yml", "registry.password", "registry-token.key"]:
        assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name
    assert (var / "registry").is_dir()
