"""The sandbox escape suite: a job tries to reach what is not its own, through the real local backend.

Each probe prints `PROBE <name> refused|LEAK <detail>`. With the sandbox on every probe must be refused; the
same probes with the sandbox off must leak (so a probe that could never see anything fails the suite).
"""

import json
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings

from jobs import lifecycle, logstore, services
from jobs.backends import sandbox
from jobs.models import Job
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from kernel.paths import BASE_DIR, VAR_DIR

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBES = r"""
import json, os, socket, sys
t = json.loads(sys.argv[1])

def probe(name, fn):
    try:
        detail = fn()
    except Exception as exc:
        print(f"PROBE {name} refused ({type(exc).__name__})", flush=True)
    else:
        print(f"PROBE {name} LEAK {str(detail)[:60]!r}", flush=True)

def read(path):
    with open(path, "rb") as f:
        return f.read(200)

def connect(host, port):
    with socket.create_connection((host, port), timeout=2):
        return f"connected to {host}:{port}"

def write(path):
    with open(path, "w") as f:
        f.write("escaped")
    return path

def signal_platform():
    os.kill(t["platform_pid"], 0)
    return "platform pid is signalable"

def root_or_platform_uid():
    if os.getuid() in (0, t["platform_uid"]):
        return f"uid {os.getuid()}"
    raise PermissionError("own uid")

probe("secret_key", lambda: read(t["secret_key"]))
probe("other_job_spec", lambda: read(t["other_spec"]))
probe("other_job_work", lambda: read(t["other_file"]))
probe("other_job_log", lambda: os.listdir(t["log_root"]) or 1 / 0)
probe("project_settings", lambda: read(t["settings_py"]))
probe("var_dir", lambda: os.listdir(t["var_dir"]) or 1 / 0)
probe("postgres", lambda: connect(t["pg_host"], t["pg_port"]))
probe("redis", lambda: connect(t["redis_host"], t["redis_port"]))
probe("signal_platform", signal_platform)
probe("write_system", lambda: write("/usr/trainyard-escape"))
probe("write_work_root", lambda: write(os.path.join(t["work_root"], "escape")))
probe("uid", root_or_platform_uid)
probe("store_password", lambda: read(t["s3_password"]))
probe("registry_password", lambda: read(t["registry_password"]))

def platform_env():
    names = ("TRAINYARD_S3", "TRAINYARD_REGISTRY", "AWS_", "DATABASE_URL", "REDIS_URL", "DJANGO_")
    found = sorted(k for k in os.environ if k.startswith(names))
    if found:
        return found
    raise LookupError("no platform variable")

probe("platform_env", platform_env)
print("ENV " + json.dumps(sorted(os.environ.values())), flush=True)
with open(os.path.join(os.getcwd(), "mine.txt"), "w") as f:  # its own folder stays writable
    f.write("ok")
print("OWN_DIR_WRITABLE", flush=True)
"""


def _log(job: Job) -> str:
    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), 1))
    return "\n".join(line.text for line in lines)


def _need_sandbox() -> None:
    try:
        sandbox.preflight(settings.TRAINYARD_SANDBOX_BWRAP)
    except sandbox.SandboxUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the sandbox escape suite: {exc}")
        pytest.skip(str(exc))


def _submit(user, command, env=None):
    job, _ = services.job_submit(
        user=user,
        data={
            "team": "demo",
            "queue": "train",
            "spec": "shared",
            "image": "python-3.11",
            "command": command,
            "env": env or {},
            "max_retries": 0,
        },
    )
    return job


def _finished(job: Job) -> Job | None:
    fresh = Job.objects.get(pk=job.pk)
    return fresh if fresh.is_terminal else None


def _targets(victim: Job) -> dict:
    work_root = Path(settings.TRAINYARD_WORK_ROOT)
    db = settings.DATABASES["default"]
    redis = urlparse(settings.REDIS_URL)
    return {
        "secret_key": str(VAR_DIR / "secret_key"),
        "other_spec": str(Path(settings.TRAINYARD_STATE_ROOT) / str(victim.id) / "attempt-1" / "spec.json"),
        "other_file": str(work_root / str(victim.id) / "work" / "secret.txt"),
        "log_root": str(settings.TRAINYARD_LOG_ROOT),
        "settings_py": str(BASE_DIR / "trainyard" / "settings.py"),
        "var_dir": str(VAR_DIR),
        "pg_host": db.get("HOST") or "127.0.0.1",
        "pg_port": int(db.get("PORT") or 5432),
        "redis_host": redis.hostname or "127.0.0.1",
        "redis_port": redis.port or 6379,
        "platform_pid": os.getpid(),
        "platform_uid": os.getuid(),
        "work_root": str(work_root),
        "s3_password": str(VAR_DIR / "s3.password"),
        "registry_password": str(VAR_DIR / "registry.password"),
    }


ESCAPE_FILE = Path("/usr/trainyard-escape")


def _run_probes(platform_user) -> tuple[Job, str]:
    (VAR_DIR / "secret_key").exists() or pytest.fail("settings should have made var/secret_key")
    ESCAPE_FILE.unlink(missing_ok=True)
    victim = _submit(
        platform_user,
        ["sh", "-c", "echo team-a-secret > secret.txt; echo victim done"],
        env={"API_TOKEN": "team-a-secret"},
    )
    assert wait_for(lambda: _finished(victim)).state == JobState.SUCCEEDED
    attacker = _submit(platform_user, [sys.executable, "-c", PROBES, json.dumps(_targets(victim))])
    done = wait_for(lambda: _finished(attacker), timeout=60)
    return done, _log(attacker)


def _probe_results(log: str) -> dict[str, str]:
    results = {}
    for line in log.splitlines():
        if line.startswith("PROBE "):
            _, name, verdict = line.split(" ", 2)
            results[name] = verdict
    return results


EXPECTED_PROBES = {
    "secret_key",
    "other_job_spec",
    "other_job_work",
    "other_job_log",
    "project_settings",
    "var_dir",
    "postgres",
    "redis",
    "signal_platform",
    "write_system",
    "write_work_root",
    "uid",
    "store_password",
    "registry_password",
    "platform_env",
}


def test_a_sandboxed_job_reaches_nothing_but_its_own_folder(platform, celery_worker_thread, settings):
    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    attacker, log = _run_probes(platform)
    results = _probe_results(log)
    assert set(results) == EXPECTED_PROBES, log
    leaks = {name: verdict for name, verdict in results.items() if not verdict.startswith("refused")}
    assert leaks == {}, log
    assert "OWN_DIR_WRITABLE" in log
    assert attacker.state == JobState.SUCCEEDED, log
    assert "team-a-secret" not in log
    # The platform's store and registry credentials are in neither the job's files nor its environment.
    for secret in (settings.TRAINYARD_S3_SECRET_ACCESS_KEY, settings.TRAINYARD_REGISTRY_PASSWORD):
        assert not secret or secret not in log
    assert not ESCAPE_FILE.exists()
    assert not (Path(settings.TRAINYARD_WORK_ROOT) / "escape").exists()


def test_the_same_probes_leak_without_the_sandbox(platform, celery_worker_thread, settings):
    """The probes can see: unsandboxed (TRAINYARD_SANDBOX=off), the very same job reads what it should not."""
    settings.TRAINYARD_SANDBOX = "off"
    try:
        _attacker, log = _run_probes(platform)
    finally:
        ESCAPE_FILE.unlink(missing_ok=True)
    results = _probe_results(log)
    for name in ["secret_key", "other_job_spec", "other_job_work", "project_settings", "postgres", "redis"]:
        assert results[name].startswith("LEAK"), log
    for name, path in [("store_password", "s3.password"), ("registry_password", "registry.password")]:
        assert results[name].startswith("LEAK") or not (VAR_DIR / path).exists(), log
    # Even unsandboxed a job's environment is its own: the platform's variables are never handed down.
    assert results["platform_env"].startswith("refused"), log


def test_spec_and_work_folders_are_closed_to_others(platform, celery_worker_thread, settings):
    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    job = _submit(platform, ["sh", "-c", "id -u; echo pid=$$"], env={"API_TOKEN": "s3cret"})
    assert wait_for(lambda: _finished(job)).state == JobState.SUCCEEDED
    root = Path(settings.TRAINYARD_WORK_ROOT)
    state = Path(settings.TRAINYARD_STATE_ROOT)
    spec = state / str(job.id) / "attempt-1" / "spec.json"
    assert spec.stat().st_mode & 0o777 == 0o600
    assert (state / str(job.id) / "attempt-1").stat().st_mode & 0o777 == 0o700
    assert state.stat().st_mode & 0o077 == 0
    assert (root / str(job.id) / "work").stat().st_mode & 0o777 == 0o700
    assert root.stat().st_mode & 0o077 == 0
    log = _log(job)
    uid = int(log.splitlines()[0])
    assert uid not in (0, os.getuid())
    if os.geteuid() == 0:
        assert (root / str(job.id) / "work").stat().st_uid == uid == sandbox.job_uid(str(job.id))
    assert "pid=2" in log  # its own PID namespace: bubblewrap's init is 1, the command 2


def test_cancel_gives_a_sandboxed_job_its_grace_period(platform, celery_worker_thread, settings):
    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    script = "trap 'echo got TERM; exit 7' TERM; echo ready; while true; do sleep 0.1; done"
    job = _submit(platform, ["sh", "-c", script])
    wait_for(lambda: "ready" in _log(job) if Job.objects.get(pk=job.pk).attempts.exists() else False)
    lifecycle.job_cancel(job_id=job.id, actor="test")
    done = wait_for(lambda: _finished(job))
    assert done.state == JobState.CANCELLED
    assert "got TERM" in _log(job)


def test_a_signal_death_inside_the_sandbox_is_reported_as_the_signal():
    assert sandbox.decode_exit(137, None) == (None, signal.SIGKILL)
    assert sandbox.decode_exit(3, None) == (3, None)
    assert sandbox.decode_exit(None, 9) == (None, 9)


def test_missing_bubblewrap_fails_the_attempt_with_a_platform_reason(platform, celery_worker_thread, settings):
    from jobs.backends import local

    settings.TRAINYARD_SANDBOX = "on"
    settings.TRAINYARD_SANDBOX_BWRAP = "/nonexistent/bwrap"
    local._sandbox_checked = False
    try:
        job = _submit(platform, ["true"])
        done = wait_for(lambda: _finished(job))
    finally:
        local._sandbox_checked = False
    attempt = done.attempts.get(number=1)
    assert done.state == JobState.FAILED
    assert attempt.failure_class == "platform"
    failed = done.events.get(kind="attempt_failed")
    assert "the job sandbox needs bubblewrap ('bwrap'), which is not installed" in failed.message


def _write_run(folder: Path) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=0.5)])
    writer.add_event(event_pb2.Event(wall_time=1.0, step=1, summary=summary))
    writer.close()


def _runs_seen_by_tensorboard(platform_user, settings) -> list[str]:
    """Team A's run, and team B's TensorBoard folder holding its own run plus a symlink to team A's."""
    import time
    import urllib.request

    from jobs import tensorboard

    base = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "tensorboard": True}
    victim, _ = services.job_submit(user=platform_user, data={**base, "command": ["true"]})
    attacker, _ = services.job_submit(user=platform_user, data={**base, "command": ["true"]})
    victim_dir = Path(tensorboard.default_logdir(victim))
    attacker_dir = Path(tensorboard.default_logdir(attacker))
    _write_run(victim_dir / "team-a-secret-run")
    _write_run(attacker_dir / "own-run")
    (attacker_dir / "stolen").symlink_to(victim_dir / "team-a-secret-run")
    route = tensorboard.route_issue(job_id=attacker.id)
    try:
        url = f"http://127.0.0.1:{route.port}/tb/{attacker.id}/data/runs"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                runs = json.loads(urllib.request.urlopen(url, timeout=2).read())
                if "own-run" in runs:
                    return runs
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError("TensorBoard did not list the job's own run")
    finally:
        tensorboard.route_revoke(route_id=route.pk)


def test_tensorboard_does_not_follow_a_symlink_out_of_the_jobs_folder(platform, settings):
    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    runs = _runs_seen_by_tensorboard(platform, settings)
    assert "own-run" in runs and not any("stolen" in r or "team-a" in r for r in runs), runs


def test_without_the_sandbox_tensorboard_follows_the_symlink(platform, settings):
    """The check above can fail: unsandboxed, the planted symlink shows team A's run."""
    settings.TRAINYARD_SANDBOX = "off"
    runs = _runs_seen_by_tensorboard(platform, settings)
    assert any(r.startswith("stolen") for r in runs), runs


NET_PROBES = r"""
import json, socket, sys
t = json.loads(sys.argv[1])
def probe(name, host, port):
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            print(f"NET {name} LEAK {s.recv(16)!r}", flush=True)
    except Exception as exc:
        print(f"NET {name} refused ({type(exc).__name__})", flush=True)
probe("outside", t["outside_host"], t["outside_port"])
probe("host_loopback_pg", "10.0.2.2", t["pg_port"])
probe("own_loopback_pg", "127.0.0.1", t["pg_port"])
probe("host_loopback_redis", "10.0.2.2", t["redis_port"])
"""


def _outside_server():
    """A TCP service on this machine's non-loopback address: what 'another machine' looks like from a job."""
    import socket
    import threading

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outward interface
        address = probe.getsockname()[0]
    except OSError:
        address = ""
    finally:
        probe.close()
    if not address or address.startswith("127."):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must test outbound job network: this machine has no non-loopback address")
        pytest.skip("no non-loopback address to stand in for another machine")
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, 0))
    server.listen(8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hello")

    threading.Thread(target=serve, daemon=True).start()
    return server, address


def _net_probes(platform_user, outbound: bool) -> dict[str, str]:
    from quotas.models import Queue

    Queue.objects.filter(name="train").update(outbound_network=outbound)
    server, address = _outside_server()
    try:
        db = settings.DATABASES["default"]
        redis = urlparse(settings.REDIS_URL)
        targets = {
            "outside_host": address,
            "outside_port": server.getsockname()[1],
            "pg_port": int(db.get("PORT") or 5432),
            "redis_port": redis.port or 6379,
        }
        job = _submit(platform_user, [sys.executable, "-c", NET_PROBES, json.dumps(targets)])
        done = wait_for(lambda: _finished(job), timeout=60)
    finally:
        server.close()
    log = _log(done)
    assert done.state == JobState.SUCCEEDED, (log, list(done.events.values_list("message", flat=True)))
    return {line.split()[1]: line.split(" ", 2)[2] for line in log.splitlines() if line.startswith("NET ")}


def test_a_queue_with_outbound_network_reaches_other_machines_but_never_the_platform(
    platform, celery_worker_thread, settings
):
    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    try:
        sandbox.network_tool()
    except sandbox.SandboxUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must test outbound job network: {exc}")
        pytest.skip(str(exc))
    results = _net_probes(platform, outbound=True)
    assert results["outside"] == "LEAK b'hello'", results
    for name in ["host_loopback_pg", "own_loopback_pg", "host_loopback_redis"]:
        assert results[name].startswith("refused"), results


def test_a_queue_without_outbound_network_gives_jobs_no_network(platform, celery_worker_thread, settings):
    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    results = _net_probes(platform, outbound=False)
    assert set(results) == {"outside", "host_loopback_pg", "own_loopback_pg", "host_loopback_redis"}
    assert all(v.startswith("refused") for v in results.values()), results


def test_outbound_network_without_slirp4netns_fails_the_attempt_with_a_platform_reason(
    platform, celery_worker_thread, settings
):
    from quotas.models import Queue

    _need_sandbox()
    settings.TRAINYARD_SANDBOX = "on"
    settings.TRAINYARD_SANDBOX_SLIRP4NETNS = "/nonexistent/slirp4netns"
    Queue.objects.filter(name="train").update(outbound_network=True)
    job = _submit(platform, ["true"])
    done = wait_for(lambda: _finished(job))
    assert done.state == JobState.FAILED
    assert done.attempts.get(number=1).failure_class == "platform"
    assert "needs slirp4netns" in done.events.get(kind="attempt_failed").message
