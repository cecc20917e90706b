"""The layering of README "Where things live" holds, and its check really fails on an upward import: the contracts
in pyproject.toml run on this checkout (kept), then on a copy with one import added inside a function body of the
kernel (broken), so a contract that silently checks nothing cannot pass here."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.paths import BASE_DIR

PACKAGES = [
    "trainyard",
    "ops",
    "frontend",
    "experiments",
    "monitoring",
    "jobs",
    "images",
    "scheduler",
    "cluster",
    "quotas",
    "kernel",
]
LINT = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.slow


def _lint(root: Path) -> subprocess.CompletedProcess:
    if not LINT.exists():
        pytest.fail(f"{LINT} is missing: import-linter is in requirements-dev.txt (make venv)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "cli")])}
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "static", "templates", "locale", "*.json", "*.mo", "*.po")
    for name in PACKAGES:
        shutil.copytree(BASE_DIR / name, root / name, ignore=ignore)
    shutil.copytree(BASE_DIR / "cli" / "trainyard_cli", root / "cli" / "trainyard_cli", ignore=ignore)
    shutil.copy(BASE_DIR / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_checkout_keeps_every_contract():
    result = _lint(BASE_DIR)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "said"),
    [
        ("kernel/_upward.py", "def f():\n    from jobs import models\n", "kernel is not allowed to import jobs"),
        ("quotas/_upward.py", "def f():\n    import jobs.selectors\n", "quotas is not allowed to import jobs"),
        ("jobs/_upward.py", "from monitoring import selectors\n", "jobs is not allowed to import monitoring"),
        (
            "monitoring/_upward.py",
            "def f():\n    from experiments import services\n",
            "monitoring is not allowed to import experiments",
        ),
        ("cli/trainyard_cli/_upward.py", "import kernel.errors\n", "trainyard_cli is not allowed to import kernel"),
    ],
)
def test_an_upward_import_breaks_the_check(tmp_path, module, line, said):
    root = _copy(tmp_path)
    (root / module).write_text(line)
    result = _lint(root)
    assert result.returncode != 0, result.stdout[-2000:]
    assert said in result.stdout, result.stdout[-3000:]
