"""Login lockout per address and slow-down per user name on the portal and the admin, and the
Content-Security-Policy header."""

import uuid

import pytest
from django.core.cache import cache
from django.test import Client

from kernel import login_guard
from kernel.login_guard import _keys
from ops.seed import seed

pytestmark = pytest.mark.django_db

ADDRESS = "10.20.30.40"


ATTACKERS = [f"10.66.0.{i}" for i in range(50)]


def _address_keys(addresses) -> list[str]:
    return [key for address in addresses for name in ("demo", "admin") for key, _ in _keys(name, address)]


@pytest.fixture
def users(settings):
    # What is tested is who is let in, slowed or refused, not the hash: Django's default (PBKDF2) costs about half a
    # second per wrong password here, and the spread attack alone makes 200 of them.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    keys = [key for name in ("demo", "admin") for key, _ in _keys(name, ADDRESS)]
    keys += [login_guard._user_key(name) for name in ("demo", "admin")]
    keys += _address_keys(ATTACKERS + ["10.20.30.41"])
    cache.delete_many(keys)
    yield
    cache.delete_many(keys)


@pytest.mark.parametrize(
    ("path", "username", "password"),
    [("/login/", "demo", "demo-pass-123"), ("/admin/login/", "admin", "admin-pass-123")],
)
def test_one_address_hammering_a_login_gets_429_and_only_that_address(users, settings, path, username, password):
    client = Client(REMOTE_ADDR=ADDRESS)
    assert client.post(path, {"username": username, "password": password}).status_code == 302  # works at first
    client = Client(REMOTE_ADDR=ADDRESS)
    for _ in range(settings.TRAINYARD_LOGIN_MAX_FAILURES):
        assert client.post(path, {"username": username, "password": "wrong"}).status_code == 200
    locked = client.post(path, {"username": username, "password": password})
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) > 0 and "Too many failed logins from this address" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    # Another address is not locked out by these failures.
    other = Client(REMOTE_ADDR="10.20.30.41")
    assert other.post(path, {"username": username, "password": password}).status_code == 302


def test_one_address_trying_many_names_gets_429(users, settings):
    client = Client(REMOTE_ADDR=ADDRESS)
    run = uuid.uuid4().hex[:8]  # names no earlier run has counted
    for i in range(settings.TRAINYARD_LOGIN_MAX_FAILURES_PER_CLIENT):
        assert client.post("/login/", {"username": f"nobody-{run}-{i}", "password": "x"}).status_code == 200
    assert client.post("/login/", {"username": "demo", "password": "demo-pass-123"}).status_code == 429
    assert (
        Client(REMOTE_ADDR="10.20.30.41").post("/login/", {"username": "demo", "password": "demo-pass-123"}).status_code
        == 302
    )


def test_a_guessing_attack_spread_over_many_addresses_slows_the_name_but_never_locks_its_owner_out(users, settings):
    """200 wrong passwords on one user name, 4 from each of 50 addresses (each under its own limit): the owner logs
    in with the right password at once from an address of their own, and even from one the attacker used."""
    attackers = ATTACKERS
    for address in attackers:
        client = Client(REMOTE_ADDR=address)
        for _ in range(settings.TRAINYARD_LOGIN_MAX_FAILURES - 1):
            assert client.post("/login/", {"username": "demo", "password": "guess"}).status_code == 200
    owner = Client(REMOTE_ADDR=ADDRESS)
    assert owner.post("/login/", {"username": "demo", "password": "demo-pass-123"}).status_code == 302
    assert "_auth_user_id" in owner.session
    shared = Client(REMOTE_ADDR=attackers[0])  # e.g. a NAT the attacker shares, under its limit
    assert shared.post("/login/", {"username": "demo", "password": "demo-pass-123"}).status_code == 302
    # The name is slowed down instead: each login for it waits, bounded, the right password's too.
    assert login_guard.delay_s("demo") == settings.TRAINYARD_LOGIN_MAX_DELAY_S
    assert login_guard.delay_s("admin") == 0


def test_the_slow_down_grows_with_each_failure_up_to_its_bound(users, settings):
    settings.TRAINYARD_LOGIN_SLOW_AFTER = 3
    settings.TRAINYARD_LOGIN_MAX_DELAY_S = 1.0
    seen = []
    for i in range(8):
        seen.append(login_guard.delay_s("demo"))
        Client(REMOTE_ADDR=ATTACKERS[i]).post("/login/", {"username": "demo", "password": "guess"})
    assert seen == [0, 0, 0, 0.25, 0.5, 1.0, 1.0, 1.0]


@pytest.mark.django_db(transaction=True)
def test_the_asgi_app_pauses_a_slowed_name_and_still_logs_its_owner_in(settings):
    """Through the real ASGI application (the pause is on the event loop, before Django): a login for a name under
    attack answers after the pause, right password included, and logs in; another name answers at once."""
    import asyncio
    import re
    import time

    import httpx

    from trainyard.asgi import application

    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    keys = [login_guard._user_key(name) for name in ("demo", "admin")]
    cache.delete_many(keys)
    settings.TRAINYARD_LOGIN_SLOW_AFTER = 0
    settings.TRAINYARD_LOGIN_MAX_DELAY_S = 1.0
    cache.set(login_guard._user_key("demo"), 5, timeout=60)  # 5 failures from elsewhere: the bound, 1 s

    async def login(username: str, password: str) -> tuple[int, float]:
        transport = httpx.ASGITransport(app=application, client=(ADDRESS, 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            form = (await client.get("/login/")).text
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
            started = time.monotonic()
            response = await client.post(
                "/login/", data={"username": username, "password": password, "csrfmiddlewaretoken": token}
            )
            return response.status_code, time.monotonic() - started

    try:
        status, took = asyncio.run(login("demo", "demo-pass-123"))
        assert status == 302 and took >= 1.0
        status, took = asyncio.run(login("admin", "admin-pass-123"))
        assert status == 302 and took < 1.0
    finally:
        cache.delete_many(keys)
        _close_connections_of(application.application_mapping["http"].app.executor)


def _close_connections_of(executor) -> None:
    """Close the database connections the ASGI app's request threads keep (else the test database cannot be
    dropped): one task per thread, held at a barrier so that each thread runs one."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(executor._max_workers)

    def close():
        connections.close_all()
        barrier.wait(timeout=10)

    for future in [executor.submit(close) for _ in range(executor._max_workers)]:
        future.result(timeout=20)


def test_a_success_clears_the_count(users, settings):
    client = Client(REMOTE_ADDR=ADDRESS)
    for _round in range(3):
        for _ in range(settings.TRAINYARD_LOGIN_MAX_FAILURES - 1):
            client.post("/login/", {"username": "demo", "password": "wrong"})
        assert client.post("/login/", {"username": "demo", "password": "demo-pass-123"}).status_code == 302
        client.logout()


@pytest.mark.parametrize("path", ["/login/", "/api/v1/specs/", "/healthz"])
def test_every_response_has_a_content_security_policy(users, path):
    response = Client().get(path)
    policy = response["Content-Security-Policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy and "object-src 'none'" in policy


def test_the_api_docs_get_the_looser_policy_they_need(users):
    client = Client()
    client.login(username="demo", password="demo-pass-123")
    assert "'unsafe-inline'" in client.get("/api/docs/")["Content-Security-Policy"].split("script-src")[1]


@pytest.mark.parametrize(
    "path", ["/static/..%2f..%2fsettings.py", "/static/%2e%2e/%2e%2e/etc/passwd", "/static/a%00b.css", "/static/../x"]
)
def test_static_paths_that_leave_the_folder_are_404_not_500(path, settings):
    from django.core.handlers.wsgi import WSGIHandler
    from django.test import RequestFactory

    from trainyard.asgi import SafeStaticFilesHandler

    handler = SafeStaticFilesHandler(WSGIHandler())
    request = RequestFactory().get(path)
    assert handler.get_response(request).status_code == 404


def test_the_web_process_believes_x_forwarded_for_only_from_configured_proxies(monkeypatch):
    from ops import processes

    monkeypatch.delenv("TRAINYARD_TRUSTED_PROXIES", raising=False)
    argv = processes.command("web")
    assert "--no-proxy-headers" in argv and "--forwarded-allow-ips" not in argv
    monkeypatch.setenv("TRAINYARD_TRUSTED_PROXIES", "10.0.0.5")
    argv = processes.command("web")
    assert argv[argv.index("--forwarded-allow-ips") + 1] == "10.0.0.5" and "--no-proxy-headers" not in argv


def test_a_request_through_a_proxy_that_is_not_trusted_is_logged_once(monkeypatch):
    from django.test import RequestFactory
    from structlog.testing import capture_logs

    from kernel import guards

    monkeypatch.setattr(guards, "_warned_untrusted_proxy", False)
    factory = RequestFactory()
    direct = factory.get("/", REMOTE_ADDR="10.0.0.9")
    believed = factory.get("/", REMOTE_ADDR="203.0.113.5", HTTP_X_FORWARDED_FOR="203.0.113.5, 10.0.0.9")
    behind = factory.get("/", REMOTE_ADDR="10.244.1.3", HTTP_X_FORWARDED_FOR="203.0.113.5")
    with capture_logs() as logs:
        assert not guards.untrusted_proxy_check(direct) and not guards.untrusted_proxy_check(believed)
        assert guards.untrusted_proxy_check(behind) and guards.untrusted_proxy_check(behind)
    assert [(e["event"], e["peer"]) for e in logs] == [("untrusted_proxy", "10.244.1.3")]
