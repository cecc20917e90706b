"""The `trainyard` CLI against a live server (the real Django app over HTTP on loopback), real jobs run by
the local backend and a real Celery worker, with a thread standing in for the beat's observe pass."""

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection
from trainyard_cli.errors import EXIT_BY_FINAL_STATE
from trainyard_cli.main import main

from jobs import lifecycle, services
from jobs.models import Job
from jobs.states import TERMINAL
from jobs.tests.conftest import platform, wait_for  # noqa: F401 - `platform` is a fixture used below
from quotas.tokens import token_create, token_revoke

pytestmark = pytest.mark.django_db(transaction=True)

JOB_YAML = """\
name: resnet-ci
team: demo
queue: train
spec: shared
image: python-3.11
command: python train.py --lr 0.1
env:
  EPOCHS: 3
  DATASET: imagenet
labels:
  branch: main
ci:
  commit: 4f2a9c1
priority: 5
timeout_s: 600
"""


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(platform, live_server, monkeypatch, tmp_path, capsys):  # noqa: F811 - the imported fixture
    """Runs `main(argv)` in-process as the demo user with a fresh token; returns code, stdout, stderr."""
    token, raw = token_create(user=platform, name="ci")
    monkeypatch.setenv("TRAINYARD_URL", live_server.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", raw)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "no-config.yaml"))

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    run.token = token
    run.raw = raw
    run.url = live_server.url
    return run


@pytest.fixture
def offline(monkeypatch, tmp_path, capsys):
    """The CLI with a token but no server behind the URL: for errors found before any request."""
    monkeypatch.setenv("TRAINYARD_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_0000_not-a-real-secret")
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "no-config.yaml"))

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def beat(platform, celery_worker_thread):  # noqa: F811 - the imported fixture
    """What the Celery beat does in production: observe live attempts and enforce timeouts, every 0.2 s.

    It asks for the worker so that it starts after it and stops before it: the in-thread worker's shutdown closes its
    broker sockets and event loop while this thread may still be waiting on a database socket, and in one CI run the
    beat's wait failed with EBADF there (a descriptor number closed under it)."""
    stop = threading.Event()
    errors: list[str] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                lifecycle.attempts_observe()
                lifecycle.timeouts_enforce()
            except Exception:  # noqa: BLE001 - surfaced by the assertion after the test, with where it was raised
                errors.append(traceback.format_exc())
            finally:
                connection.close()
            stop.wait(0.2)

    thread = threading.Thread(target=loop, name="fake-beat", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(10)
    assert not errors, "\n".join(errors)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def job_yaml(command: str, **fields) -> str:
    data = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": ["sh", "-c", command],
        **fields,
    }
    return json.dumps(data)  # JSON is YAML


# ------------------------------------------------------------------------------------------------ submit


def test_submit_from_yaml_creates_the_job_with_its_fields(cli, tmp_path):
    result = cli("submit", write(tmp_path, JOB_YAML))
    assert result.code == 0, result.err
    job = Job.objects.get()
    assert result.out.strip() == str(job.id)
    assert f"submitted job {job.id} (resnet-ci) to demo/train" in result.err
    assert job.name == "resnet-ci" and job.owner.username == "demo" and job.queue.name == "train"
    assert job.spec.name == "shared" and job.gpu_milli == 250
    assert job.command == ["python", "train.py", "--lr", "0.1"]
    assert job.env == {"EPOCHS": "3", "DATASET": "imagenet"}
    assert job.labels == {"branch": "main"} and job.ci == {"commit": "4f2a9c1"}
    assert job.priority == 5 and job.timeout_s == 600


def test_submit_with_the_same_idempotency_key_returns_the_same_job(cli, tmp_path):
    path = write(tmp_path, JOB_YAML)
    first = cli("submit", path, "--idempotency-key", "pipeline-81-train")
    again = cli("submit", path, "--idempotency-key", "pipeline-81-train", "--json")
    assert first.code == 0 and again.code == 0, again.err
    assert json.loads(again.out)["id"] == first.out.strip()
    assert "already submitted with this Idempotency-Key" in again.err
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("surprise: 1\n", "job.yaml:16: surprise: unknown field (unknown_field)"),
        ("max_retries: lots\n", "job.yaml:16: max_retries: A valid integer is required. (invalid)"),
    ],
)
def test_submit_shows_each_rejected_field_with_its_line_and_code(cli, tmp_path, extra, expected):
    result = cli("submit", write(tmp_path, JOB_YAML + extra))
    assert result.code == 4
    assert "job.yaml: the server rejected the job (1 error):" in result.err
    assert expected in result.err
    assert "Traceback" not in result.err
    assert not Job.objects.exists()


def test_submit_of_a_file_with_a_mistyped_image_and_five_more_errors_prints_them_all(cli, tmp_path):
    text = (
        "team: demo\nqueue: train\nspec: nope\nimage: pytorch-9.9\ncommand: []\ntimeout_s: soon\n"
        "max_retries: 99\nenv:\n  1BAD: x\n"
    )
    result = cli("submit", write(tmp_path, text))
    assert result.code == 4, result.err  # the validation exit code, never 6 "server unreachable"
    assert "job.yaml: the server rejected the job (6 errors):" in result.err, result.err
    for line in (
        "job.yaml:3: spec: ",
        "job.yaml:4: image: 'pytorch-9.9' is not in the image catalog",
        "(unknown_image)",
        "job.yaml:5: command: ",
        "job.yaml:6: timeout_s: ",
        "job.yaml:7: max_retries: ",
        "job.yaml:8: env: ",
    ):
        assert line in result.err, (line, result.err)
    assert "cannot reach" not in result.err and not Job.objects.exists()


def test_submit_shows_service_errors_on_the_nested_field(cli, tmp_path):
    text = JOB_YAML.replace("queue: train", "queue: debug").replace("spec: shared", "spec: guaranteed")
    result = cli("submit", write(tmp_path, text))
    assert result.code == 4
    assert "job.yaml:4: spec:" in result.err and "(spec_not_allowed_in_queue)" in result.err
    bad_env = JOB_YAML.replace("  DATASET: imagenet", "  CUDA_VISIBLE_DEVICES: '0'")
    result = cli("submit", write(tmp_path, bad_env))
    assert result.code == 4 and "(reserved_env_name)" in result.err and "job.yaml:7: env: " in result.err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("team: demo\nqueue: train\n  image: x\n", "job.yaml:3:8: invalid YAML: mapping values are not allowed here"),
        ("team: demo\ncommand: [echo\n", "job.yaml:3:1: invalid YAML"),
        ("", "job.yaml is empty"),
        ("- team: demo\n", "job.yaml:1: expected a mapping of job fields"),
        ("team: demo\nimage: a\nteam: other\n", "job.yaml:3: team is given twice (first on line 1)"),
    ],
)
def test_submit_refuses_a_broken_job_file_before_calling_the_server(offline, tmp_path, text, expected):
    result = offline("submit", write(tmp_path, text))
    assert result.code == 4
    assert expected in result.err
    assert "cannot reach" not in result.err


def test_submit_of_a_missing_file_says_so(offline, tmp_path):
    result = offline("submit", str(tmp_path / "nope.yaml"))
    assert result.code == 4
    assert result.err.strip() == f"trainyard: error: job file {tmp_path / 'nope.yaml'} does not exist"


# ---------------------------------------------------------------------------------------------- lifecycle


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "fields", "code", "said"),
    [
        ("echo step 1; echo step 2", {}, 0, "succeeded"),
        ("echo bad input >&2; exit 1", {"max_retries": 0}, 1, "failed"),
        ("sleep 30", {"timeout_s": 1}, 3, "timed out"),
    ],
)
def test_wait_exits_with_the_jobs_outcome(cli, beat, celery_worker_thread, tmp_path, command, fields, code, said):
    result = cli("submit", write(tmp_path, job_yaml(command, **fields)), "--wait", "--interval", "0.2")
    job = Job.objects.get()
    assert result.code == code, result.err
    assert job.state in TERMINAL and EXIT_BY_FINAL_STATE[job.state] == code
    assert result.out.strip() == str(job.id)
    assert f"job {job.id} {said}" in result.err
    if code == 1:
        assert "[user failure]" in result.err


@pytest.mark.slow
def test_follow_streams_every_attempts_lines_across_a_retry(cli, beat, celery_worker_thread, tmp_path):
    script = (
        'echo "try $TRAINYARD_ATTEMPT"; if [ "$TRAINYARD_ATTEMPT" = "1" ]; then sleep 0.5; kill -9 $$; fi; '
        'for i in 1 2 3; do echo "epoch $i"; sleep 0.2; done'
    )
    path = write(tmp_path, job_yaml(script, spec="guaranteed", max_retries=2))
    result = cli("submit", path, "--follow", "--interval", "0.2")
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["try 1", "try 2", "epoch 1", "epoch 2", "epoch 3"]
    assert "--- attempt 2 (attempt 1: platform failure, retry elsewhere) ---" in result.err
    assert Job.objects.get().attempts.count() == 2


@pytest.mark.slow
def test_logs_shows_the_jobs_lines(cli, beat, celery_worker_thread, tmp_path):
    result = cli(
        "submit", write(tmp_path, job_yaml("for i in 1 2 3 4; do echo line $i; done")), "--wait", "--interval", "0.2"
    )
    assert result.code == 0, result.err
    job_id = result.out.strip()
    logs = cli("logs", job_id)
    assert logs.code == 0 and logs.out.splitlines() == ["line 1", "line 2", "line 3", "line 4"]
    tail = cli("logs", job_id, "--tail", "2")
    assert tail.out.splitlines() == ["line 3", "line 4"]
    followed = cli("logs", job_id, "-f", "--interval", "0.2")
    assert followed.code == 0 and followed.out.splitlines()[-1] == "line 4"
    missing = cli("logs", job_id, "--attempt", "5")
    assert missing.code == 4 and f"job {job_id} has no attempt 5 (attempts: 1)" in missing.err


@pytest.mark.slow
def test_cancel_stops_a_running_job(cli, beat, celery_worker_thread, tmp_path):
    job_id = cli("submit", write(tmp_path, job_yaml("sleep 60"))).out.strip()
    wait_for(lambda: Job.objects.get(pk=job_id).state == "running", observe=False)
    result = cli("cancel", job_id, "--wait", "--interval", "0.2")
    assert result.code == 2, result.err
    assert f"job {job_id} cancelling: the backend is stopping it" in result.err
    assert Job.objects.get(pk=job_id).state == "cancelled"
    again = cli("cancel", job_id)
    assert again.code == 0 and f"job {job_id} cancelled" in again.err


def test_cancel_of_a_finished_job_is_refused(cli, tmp_path):
    job_id = cli("submit", write(tmp_path, JOB_YAML)).out.strip()
    services.job_transition(job_id=job_id, to="failed", actor="test", reason="image_pull_failed")
    result = cli("cancel", job_id)
    assert result.code == 4
    assert f"cannot cancel job {job_id}: the job already failed" in result.err


# ------------------------------------------------------------------------------------------ read commands


def test_status_json_and_text(cli, tmp_path):
    job_id = cli("submit", write(tmp_path, JOB_YAML)).out.strip()
    result = cli("status", job_id, "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["id"] == job_id and data["state"] == "pending" and data["attempts"] == []
    assert data["queue"] == "train" and "estimated_start" in data
    text = cli("status", job_id)
    assert text.code == 0
    assert "State" in text.out and "pending (" in text.out
    assert "python train.py --lr 0.1" in text.out


def test_status_of_an_unknown_or_malformed_job(cli):
    missing = str(uuid.uuid4())
    result = cli("status", missing)
    assert result.code == 4 and f"job {missing} not found" in result.err
    result = cli("status", "not-a-job")
    assert result.code == 4 and "'not-a-job' is not a job id" in result.err


def test_list_filters_and_limits(cli, tmp_path):
    ids = [cli("submit", write(tmp_path, JOB_YAML)).out.strip() for _ in range(3)]
    lifecycle.job_cancel(job_id=ids[0], actor="test")
    pending = json.loads(cli("list", "--state", "pending", "--json").out)
    assert sorted(j["id"] for j in pending) == sorted(ids[1:])
    both = json.loads(cli("list", "--state", "pending,cancelled", "--queue", "train", "--limit", "2", "--json").out)
    assert [j["id"] for j in both] == [ids[2], ids[1]]  # newest first, at most 2
    text = cli("list", "--team", "demo")
    assert text.code == 0 and all(i in text.out for i in ids) and "cancelled" in text.out
    bad = cli("list", "--state", "sleeping")
    assert bad.code == 4 and "state:" in bad.err and "(invalid_choice)" in bad.err
    assert cli("list", "--limit", "0").code == 4


def test_queues_and_quota(cli, tmp_path):
    cli("submit", write(tmp_path, JOB_YAML))
    queues = cli("queues", "--json")
    assert queues.code == 0
    assert {q["name"] for q in json.loads(queues.out)} == {"debug", "train", "distributed"}
    text = cli("queues")
    assert "train" in text.out and "WAITING" in text.out
    line = cli("queues", "train")
    assert line.code == 0 and "resnet-ci" in line.out
    assert cli("queues", "nope").code == 4
    quota = cli("quota", "demo", "--json")
    assert quota.code == 0 and json.loads(quota.out)["quota"]["gpu_milli"] == 4000
    text = cli("quota")
    assert "team demo" in text.out and "GPUs" in text.out and "4" in text.out
    missing = cli("quota", "nope")
    assert missing.code == 4 and "no team 'nope'" in missing.err


# ------------------------------------------------------------------------------------ errors and config


def test_a_revoked_token_is_a_clear_error(cli, tmp_path):
    token_revoke(token=cli.token)
    result = cli("queues")
    assert result.code == 5
    assert result.err.startswith("trainyard: error: the server rejected the API token: invalid or revoked token")
    assert len(result.err.strip().splitlines()) == 1


def test_no_token_is_a_clear_error(offline, monkeypatch):
    monkeypatch.delenv("TRAINYARD_TOKEN")
    result = offline("queues")
    assert result.code == 5 and "no API token configured" in result.err


def test_an_unreachable_server_is_a_clear_error(offline):
    result = offline("status", str(uuid.uuid4()))
    assert result.code == 6
    assert result.err.startswith(
        f"trainyard: error: cannot reach the Trainyard server at {os.environ['TRAINYARD_URL']}"
    )
    assert "Traceback" not in result.err


def test_rate_limits_are_retried_after_retry_after_then_given_up(cli, settings, monkeypatch):
    from kernel.throttles import PerTokenThrottle

    cache = dict(settings.CACHES["default"], KEY_PREFIX=f"cli-test-{uuid.uuid4().hex}")
    settings.CACHES = {"default": cache}
    monkeypatch.setattr(PerTokenThrottle, "THROTTLE_RATES", {"read": "1/s", "submit": "1/s", "write": "1/s"})
    ok = cli("quota", "demo")  # one GET, then a second for `quota` without a team below
    again = cli("quota")
    assert ok.code == 0 and again.code == 0, again.err
    assert "rate limited; retrying in 1 s (1/5)" in again.err
    monkeypatch.setattr(PerTokenThrottle, "THROTTLE_RATES", {"read": "1/d", "submit": "1/d", "write": "1/d"})
    settings.CACHES = {"default": dict(cache, KEY_PREFIX=f"cli-test-{uuid.uuid4().hex}")}
    cli("queues")
    refused = cli("queues")
    assert refused.code == 6
    assert "rate limited by the server: try again in" in refused.err


def test_login_writes_a_private_config_that_later_commands_use(cli, tmp_path, monkeypatch):
    config = tmp_path / "home" / "trainyard" / "config.yaml"
    monkeypatch.setenv("TRAINYARD_CONFIG", str(config))
    monkeypatch.delenv("TRAINYARD_URL")
    monkeypatch.delenv("TRAINYARD_TOKEN")
    bad = cli("login", "--url", cli.url, "--token", "ty_beef_wrong")
    assert bad.code == 5 and "invalid or revoked token" in bad.err and not config.exists()
    result = cli("login", "--url", cli.url + "/api/v1/", "--token", cli.raw)
    assert result.code == 0, result.err
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert f"url: {cli.url}\n" in config.read_text()
    quota = cli("quota", "--json")
    assert quota.code == 0 and json.loads(quota.out)[0]["slug"] == "demo"


def test_a_broken_config_file_is_named_with_its_line(offline, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("url: http://x\ntoken: [oops\n")
    monkeypatch.setenv("TRAINYARD_CONFIG", str(config))
    monkeypatch.delenv("TRAINYARD_TOKEN")
    result = offline("queues")
    assert result.code == 5 and f"config file {config}:3: invalid YAML" in result.err


def test_bad_arguments_exit_with_the_usage_code(offline):
    assert offline("submit").code == 4
    assert offline("logs", str(uuid.uuid4()), "--tail", "-3").code == 4
    assert offline("frobnicate").code == 4
    assert offline("--help").code == 0


def test_exit_codes_cover_exactly_the_terminal_states():
    assert set(EXIT_BY_FINAL_STATE) == set(TERMINAL)


# ------------------------------------------------------------------------------------- the real program


def test_console_script_runs_as_a_separate_program(cli, tmp_path):
    job_id = cli("submit", write(tmp_path, JOB_YAML)).out.strip()
    program = Path(sys.executable).with_name("trainyard")
    env = {**os.environ, "TRAINYARD_URL": cli.url, "TRAINYARD_TOKEN": cli.raw}
    done = subprocess.run(
        [str(program), "status", job_id, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["id"] == job_id
    revoked = subprocess.run(
        [str(program), "cancel", job_id],
        env={**env, "TRAINYARD_TOKEN": "ty_x_y"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert revoked.returncode == 5 and "Traceback" not in revoked.stderr


def test_the_cli_loads_no_django_app_code():
    probe = (
        "import sys, trainyard_cli.main; "
        "bad = [m for m in sys.modules if m.split('.')[0] in {'jobs', 'quotas', 'cluster', 'images', "
        "'rest_framework', 'httpx_django'} or m.startswith(('django.db', 'django.apps'))]; "
        "print(','.join(bad))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_submit_pins_gpu_models_and_names_an_unknown_one_on_its_line(cli, tmp_path):
    from cluster.models import GPU

    model = GPU.objects.values_list("model", flat=True).first()
    result = cli("submit", write(tmp_path, JOB_YAML + f"gpu_models: ['{model}']\n"))
    assert result.code == 0, result.err
    assert Job.objects.get().gpu_models == [model]
    refused = cli("submit", write(tmp_path, JOB_YAML + "gpu_models: [B200]\n"))
    assert refused.code == 4 and "job.yaml:16: gpu_models:" in refused.err and "(unknown_gpu_model)" in refused.err


def test_submit_a_preemptible_job_from_yaml(cli, tmp_path):
    from quotas.models import Queue

    refused = cli("submit", write(tmp_path, JOB_YAML + "preemptible: true\n"))
    assert refused.code == 4
    assert "job.yaml:16: preemptible: queue 'train' does not take preemptible jobs (preemptible_not_allowed)" in (
        refused.err
    )
    Queue.objects.filter(name="train").update(allow_preemptible=True)
    result = cli("submit", write(tmp_path, JOB_YAML + "preemptible: true\n"))
    assert result.code == 0, result.err
    assert Job.objects.get().preemptible is True
