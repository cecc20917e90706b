"""A real image build whose worker dies mid-way: a prefork Celery worker runs a build with podman (a step that sleeps),
its pool child is killed with SIGKILL while podman runs. The reaper (beat's images.reap_builds pass) must end the
build `failed` saying why, with nothing of it left running, and a rebuild must start a new build that the same worker
(its new child) carries to the end. (Leftovers that outlive their worker are killed by the reaper too: podman dies
with its worker here, so images/tests/test_builds.py plants one to check that part.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings as django_settings
from django.db import connection

from images import services
from images.models import ImageBuild
from images.tests.conftest import _copy_with_libraries, auth_args, images_env, podman, upstream  # noqa: F401 - fixtures
from kernel import proctree

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def sleepy_upstream(images_env, registry_url, build_root, tmp_path):  # noqa: F811 - the imported fixture
    """An upstream image with /bin/sleep, so a build step can take its time without burning a core."""
    rootfs = tmp_path / "rootfs"
    _copy_with_libraries("/bin/dash", rootfs)
    (rootfs / "bin" / "dash").rename(rootfs / "bin" / "sh")
    _copy_with_libraries("/bin/sleep", rootfs)
    (tmp_path / "Containerfile").write_text("FROM scratch\nCOPY rootfs/ /\n")
    reference = f"{urlparse(registry_url).netloc}/upstream/sleepy:1"
    made = podman(build_root, "build", "--isolation", "chroot", "-t", "localhost/upstream-sleepy", str(tmp_path))
    assert made.returncode == 0, made.stdout + made.stderr
    auth = auth_args(tmp_path, urlparse(registry_url).netloc)  # the session's registry wants its password
    pushed = podman(build_root, "push", "--tls-verify=false", *auth, "localhost/upstream-sleepy", reference)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    return reference


def _worker(queue: str) -> subprocess.Popen:
    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        REDIS_URL=django_settings.REDIS_URL,
        CELERY_BROKER_URL=django_settings.CELERY_BROKER_URL,
        TRAINYARD_REGISTRY_URL=django_settings.TRAINYARD_REGISTRY_URL,
        TRAINYARD_BUILD_ROOT=str(django_settings.TRAINYARD_BUILD_ROOT),
        TRAINYARD_BUILD_REGISTRY_RETRY_S="0.1",
    )
    argv = ["celery", "-A", "trainyard", "worker", "--pool", "prefork", "--concurrency", "1", "-Q", queue]
    return subprocess.Popen(
        [sys.executable, "-m", *argv, "-l", "INFO", "-n", f"builds-{os.getpid()}@%h"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _build_processes(build_id: int) -> set[int]:
    tag = services.build_tag(build_id).encode()
    found = set()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if tag in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            continue
    return found


def _wait(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {seconds:g} s")


def test_a_build_whose_worker_child_is_killed_is_reaped_and_a_rebuild_completes(
    sleepy_upstream, settings, _isolated_broker_queue
):
    base = services.base_image_define(
        name="sleepy-base", containerfile=f"FROM {sleepy_upstream}\nRUN sleep 6\n",
        cuda_version="12.4", framework="none", min_driver_version="550.54",
    )  # fmt: skip
    worker = _worker(_isolated_broker_queue)
    try:
        first = services.build_request(image=base)
        _wait(lambda: ImageBuild.objects.get(pk=first.pk).status == "running", 120, "the build running")
        left = _wait(lambda: _build_processes(first.pk), 60, "podman running the build")
        children = [pid for pid in proctree.descendants(worker.pid) if (proctree._stat(pid) or (0,))[0] == worker.pid]
        assert len(children) == 1, children  # the pool's one child, running the build
        os.kill(children[0], signal.SIGKILL)  # as the kernel's OOM killer would
        time.sleep(1)
        assert ImageBuild.objects.get(pk=first.pk).status == "running"  # nobody said otherwise yet

        report = _wait(lambda: services.builds_reap()["reaped"], 30, "the reaper ending the build")
        assert report == 1
        first.refresh_from_db()
        assert first.status == "failed" and "the worker running this build stopped before it ended" in first.log
        # Whatever podman left (it gets a parent-death signal, so usually nothing) is gone once the reaper ran.
        _wait(lambda: not (_build_processes(first.pk) & left), 10, "the leftover podman processes killed")

        again = services.build_request(image=base)
        assert again.pk != first.pk and again.status == "queued"
        done = _wait(
            lambda: (b := ImageBuild.objects.get(pk=again.pk)).status in ("succeeded", "failed") and b, 240,
            "the rebuild ending",
        )  # fmt: skip
        assert done.status == "succeeded", done.log[-3000:]
        base.refresh_from_db()
        assert base.digest == done.digest
        assert services.builds_reap() == {"reaped": 0, "requeued": 0}
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        for pid in _build_processes(first.pk if "first" in locals() else 0):
            os.kill(pid, signal.SIGKILL)
