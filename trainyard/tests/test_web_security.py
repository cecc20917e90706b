"""Login lockout on the portal and the admin, and the Content-Security-Policy header."""

import pytest
from django.core.cache import cache
from django.test import Client

from kernel.login_guard import _keys
from ops.seed import seed

pytestmark = pytest.mark.django_db

ADDRESS = "10.20.30.40"


@pytest.fixture
def users(settings):
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    keys = [key for name in ("demo", "admin") for key, _ in _keys(name, ADDRESS)]
    cache.delete_many(keys)
    yield
    cache.delete_many(keys)


@pytest.mark.parametrize(
    ("path", "username", "password"),
    [("/login/", "demo", "demo-pass-123"), ("/admin/login/", "admin", "admin-pass-123")],
)
def test_repeated_failures_lock_the_login_even_for_the_right_password(users, settings, path, username, password):
    client = Client(REMOTE_ADDR=ADDRESS)
    assert client.post(path, {"username": username, "password": password}).status_code == 302  # works at first
    client = Client(REMOTE_ADDR=ADDRESS)
    for _ in range(settings.TRAINYARD_LOGIN_MAX_FAILURES):
        assert client.post(path, {"username": username, "password": "wrong"}).status_code == 200
    locked = client.post(path, {"username": username, "password": password})
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) > 0 and "Too many failed logins" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    # Another address is not locked out by these failures (they stay under the per-user limit).
    other = Client(REMOTE_ADDR="10.20.30.41")
    assert other.post(path, {"username": username, "password": password}).status_code == 302


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
