"""The CLI packaged alone (`cli/pyproject.toml`): built into a wheel, installed into a fresh virtual environment
with only its real dependencies (no Django, no Celery), and run against a live server."""

import os
import shutil
import subprocess
import sys

import pytest

from jobs.models import Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from kernel.paths import BASE_DIR
from quotas.tokens import token_create

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PYTHON = shutil.which("python3.11") or sys.executable


def _run(*argv, env=None, timeout=300) -> subprocess.CompletedProcess:
    # Outside the checkout, so nothing of the repository is importable by accident.
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd="/")


def _unavailable(result: subprocess.CompletedProcess, what: str) -> None:
    """pip needs the package index for the build backend and the two dependencies: without it, say so."""
    text = result.stdout + result.stderr
    offline = any(
        s in text for s in ("No matching distribution", "Failed to establish", "Temporary failure", "timed out")
    )
    if offline and os.environ.get("CI") != "true":
        pytest.skip(f"{what} needs the Python package index, which cannot be reached: {text.strip()[-300:]}")
    raise AssertionError(f"{what} failed:\n{text[-3000:]}")


@pytest.fixture(scope="module")
def cli_venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-package")
    wheels = root / "wheels"
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(BASE_DIR / "cli"))
    if built.returncode != 0:
        _unavailable(built, "building the CLI wheel")
    wheel = next(wheels.glob("trainyard_cli-*.whl"))
    venv = root / "venv"
    made = _run(PYTHON, "-m", "venv", str(venv))
    assert made.returncode == 0, made.stderr
    installed = _run(str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", str(wheel))
    if installed.returncode != 0:
        _unavailable(installed, "installing the CLI wheel")
    return venv


def test_the_wheel_holds_only_the_cli_and_installs_without_the_platform(cli_venv):
    python = str(cli_venv / "bin" / "python")
    listed = _run(python, "-m", "pip", "list", "--format=freeze").stdout.lower()
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert {"trainyard-cli", "httpx", "pyyaml"} <= names
    assert not names & {"django", "celery", "djangorestframework", "trainyard", "kubernetes", "redis"}, names
    assert _run(python, "-c", "import django").returncode != 0
    assert _run(python, "-c", "import trainyard").returncode != 0, "the platform package must not be installed"
    helped = _run(str(cli_venv / "bin" / "trainyard"), "--help")
    assert helped.returncode == 0 and "submit" in helped.stdout and "--template" not in helped.stderr
    version = _run(str(cli_venv / "bin" / "trainyard"), "--version")
    assert version.returncode == 0 and version.stdout.strip() == "trainyard 0.1.0"


def test_the_installed_cli_talks_to_a_live_server(cli_venv, platform, live_server, tmp_path):  # noqa: F811
    _token, raw = token_create(user=platform, name="ci-runner")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "TRAINYARD_URL": live_server.url,
        "TRAINYARD_TOKEN": raw,
    }
    trainyard = str(cli_venv / "bin" / "trainyard")
    queues = _run(trainyard, "queues", env=env, timeout=60)
    assert queues.returncode == 0, queues.stderr
    assert "train" in queues.stdout and "debug" in queues.stdout
    job_file = tmp_path / "job.yaml"
    job_file.write_text("team: demo\nqueue: train\nspec: shared\nimage: python-3.11\ncommand: python train.py\n")
    submitted = _run(trainyard, "submit", str(job_file), env=env, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(pk=submitted.stdout.strip())
    assert job.owner == platform and job.command == ["python", "train.py"]
    status = _run(trainyard, "status", str(job.id)[:8], env=env, timeout=60)
    assert status.returncode == 0 and str(job.id) in status.stdout
    rejected = _run(trainyard, "status", str(job.id), env={**env, "TRAINYARD_TOKEN": "ty_0000_wrong"}, timeout=60)
    assert rejected.returncode == 5 and "rejected the API token" in rejected.stderr
