"""What the browser tests share: a live portal (the ASGI app in a uvicorn process, a real Celery worker, the
beat's observe pass, the local backend) and a headless Chromium tab on it, plus small helpers. Screenshots go to
`test-artifacts/screenshots/` (not committed; CI keeps them as artifacts).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import pytest
from django.conf import settings as django_settings
from django.db import connection

from jobs import lifecycle
from jobs.models import TensorBoardRoute
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture, shared with the jobs tests
from kernel.paths import BASE_DIR
from ops.processes import command
from quotas.models import Queue
from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

CHROMIUM = os.environ.get("TRAINYARD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

# Every browser test module sets `pytestmark = BROWSER_MARKS`.
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"no Chromium at {CHROMIUM}: install Debian's chromium (apt-get install -y chromium)",
    ),
]
SCREENSHOTS = BASE_DIR / "test-artifacts" / "screenshots"
TIMEOUT_MS = 30_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _database_url() -> str:
    db = connection.settings_dict  # inside a transactional_db test: the test database
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _wait_http(url: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer in {timeout} s")


@pytest.fixture
def observer():
    """The beat's observe pass, every 0.2 s, in a thread."""
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.is_set():
                try:
                    lifecycle.attempts_observe()
                except Exception:  # noqa: BLE001 - keep observing; a failed pass is retried like the beat's
                    pass
                stop.wait(0.2)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="observe", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(10)


@pytest.fixture
def live_portal(
    platform,  # noqa: F811 - the fixture imported above
    celery_worker_thread,
    observer,
    _isolated_broker_queue,
    tmp_path,
):
    """uvicorn serving the ASGI app on a free loopback port, sharing the test's database, Redis, Celery queue,
    log, work, state and code roots."""
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": django_settings.REDIS_URL,
        "TRAINYARD_CELERY_QUEUE": _isolated_broker_queue,
        "TRAINYARD_BACKEND": "local",
        "TRAINYARD_LOCAL_GPUS": django_settings.TRAINYARD_LOCAL_GPUS,
        "TRAINYARD_LOG_ROOT": str(django_settings.TRAINYARD_LOG_ROOT),
        "TRAINYARD_WORK_ROOT": str(django_settings.TRAINYARD_WORK_ROOT),
        "TRAINYARD_STATE_ROOT": str(django_settings.TRAINYARD_STATE_ROOT),
        "TRAINYARD_CODE_ROOT": str(django_settings.TRAINYARD_CODE_ROOT),  # code uploaded on a form, run by the worker
        "TRAINYARD_CANCEL_GRACE_S": str(django_settings.TRAINYARD_CANCEL_GRACE_S),
        "TRAINYARD_SERVE_STATIC": "true",
        "TRAINYARD_LOG_LEVEL": "WARNING",
    }
    log = open(tmp_path / "web.log", "wb")  # noqa: SIM115 - closed at teardown
    web = subprocess.Popen(
        [sys.executable, "-m", *command("web", host="127.0.0.1", port=port)],
        cwd=BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(base + "/healthz", timeout=60)
        other = TeamFactory(slug="vision", name="Vision team")
        for queue in Queue.objects.all():
            queue.teams.add(other)
        outsider = UserFactory(username="olga")
        MembershipFactory(team=other, user=outsider)
        yield SimpleNamespace(url=base, demo=platform, outsider=outsider, log=tmp_path / "web.log")
    finally:
        web.terminate()
        try:
            web.wait(15)
        except subprocess.TimeoutExpired:
            web.kill()
        log.close()
        from jobs.tensorboard import route_revoke

        for route_id in TensorBoardRoute.objects.filter(state="active").values_list("id", flat=True):
            route_revoke(route_id=route_id)
        # Left open, this connection would keep the test database from being dropped at the end of the session.
        connection.close()


@pytest.fixture
def page(live_portal, monkeypatch, request):
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        # bypass_csp: Playwright evaluates wait_for_function's expression with eval, which the portal's
        # Content-Security-Policy (scripts from the platform only) rightly blocks; the header has tests of its own.
        context = browser.new_context(
            base_url=live_portal.url,
            viewport={"width": 1280, "height": 900},
            locale="en-US",
            bypass_csp=True,
        )
        context.set_default_timeout(TIMEOUT_MS)
        tab = context.new_page()
        yield tab
        # The test's own queries ran beside Playwright's event loop, on a connection of their own: close it.
        connection.close()
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            for i, open_tab in enumerate(context.pages):
                open_tab.screenshot(path=str(SCREENSHOTS / f"failure-{i}.png"), full_page=True)
        context.close()
        browser.close()


def shot(tab, name: str) -> None:
    tab.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def log_in(tab, username: str = "demo", password: str = "demo-pass-123") -> None:
    tab.goto("/login/")
    tab.fill("#id_username", username)
    tab.fill("#id_password", password)
    tab.click("button.primary")
    tab.wait_for_url(re.compile(r"/jobs/$"))


def press(tab, selector: str) -> None:
    """Click a button once the focused field has lost focus (its change handler run), as after a Tab: a click
    whose mousedown also blurs a just-filled field sometimes landed on the form instead of the button."""
    tab.evaluate("document.activeElement && document.activeElement.blur()")
    tab.click(selector)
