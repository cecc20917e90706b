"""TensorBoard routes: real tensorboard processes behind the authenticated proxy, issued and revoked."""

import os
import socket
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs import lifecycle, services, tensorboard
from jobs.models import TensorBoardRoute
from quotas.tests.factories import UserFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _port_free(port):
    """No process listens on the port. SO_REUSEADDR, as a server reusing it would: connections the stopped
    TensorBoard closed first linger in TIME_WAIT for a minute, and a plain bind fails on them though nothing listens."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kill(pid):
    """SIGKILL the TensorBoard's process group and reap it (it is this process's child)."""
    os.killpg(pid, 9)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.1)


def _get_until_ok(client, url, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get(url)
        if response.status_code != 503:
            return response
        time.sleep(0.3)
    raise AssertionError("TensorBoard did not come up")


def test_several_routes_at_once_are_isolated_authenticated_and_freed(platform):
    jobs = [
        services.job_submit(
            user=platform,
            data={
                "team": "demo",
                "queue": "train",
                "spec": "shared",
                "image": "python-3.11",
                "command": ["true"],
                "tensorboard": True,
                "name": f"tb{i}",
            },
        )[0]
        for i in range(3)
    ]
    routes = [tensorboard.route_issue(job_id=job.id) for job in jobs]
    assert tensorboard.route_issue(job_id=jobs[0].id).pk == routes[0].pk  # issued once
    ports = {r.port for r in routes}
    assert len(ports) == 3

    member = Client()
    member.force_login(platform)
    for job in jobs:
        page = _get_until_ok(member, f"/tb/{job.id}/")
        assert page.status_code == 200 and b"TensorBoard" in page.content
        # The browser gets the body as sent (never labelled gzip after it was decoded), and no asset URL that
        # leaves the job's route.
        gzipped = member.get(f"/tb/{job.id}/", HTTP_ACCEPT_ENCODING="gzip, deflate, br")
        assert "Content-Encoding" not in gzipped and gzipped.content.startswith(b"<!doctype html>")
        assert b"url(/font-roboto/" not in gzipped.content
        assert f"url(/tb/{job.id}/font-roboto/".encode() in gzipped.content
        script = member.get(f"/tb/{job.id}/index.js", HTTP_ACCEPT_ENCODING="gzip")
        assert script.status_code == 200 and "Content-Encoding" not in script
        assert script["Content-Type"].startswith(("application/javascript", "text/javascript"))
    stranger = Client()
    stranger.force_login(UserFactory(username="stranger"))
    assert stranger.get(f"/tb/{jobs[0].id}/").status_code == 404
    anonymous = Client()
    assert anonymous.get(f"/tb/{jobs[0].id}/").status_code == 403
    link = tensorboard.signed_link(jobs[0].id)
    shared = anonymous.get(link)
    assert shared.status_code == 200
    assert anonymous.get(f"/tb/{jobs[0].id}/").status_code == 200  # the link left a cookie for this route only
    assert anonymous.get(f"/tb/{jobs[1].id}/").status_code == 403
    assert anonymous.get(f"/tb/{jobs[1].id}/?tb_sig=forged:sig").status_code == 403

    for job in jobs:
        lifecycle.job_cancel(job_id=job.id, actor="demo")  # terminal: the route expires after the grace period
    assert TensorBoardRoute.objects.filter(expires_at__isnull=False).count() == 3
    TensorBoardRoute.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert tensorboard.routes_reap() == 3
    for route in routes:
        assert not _alive(route.pid)
        assert _port_free(route.port)
    assert not TensorBoardRoute.objects.filter(state="active").exists()
    gone = member.get(f"/tb/{jobs[0].id}/")
    assert gone.status_code == 404 and gone.json()["code"] == "tensorboard_not_running"


def test_the_platform_stopping_stops_every_tensorboard_and_a_dead_one_is_replaced(platform):
    from django.core.management import call_command

    base = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "tensorboard": True}
    jobs = [
        services.job_submit(user=platform, data={**base, "command": ["true"], "name": f"t{i}"})[0] for i in range(2)
    ]
    first, second = (tensorboard.route_issue(job_id=job.id) for job in jobs)
    assert _alive(first.pid) and _alive(second.pid)

    # Its process died (a crash, a reboot): the reaper revokes the route, and the next visit starts a fresh one.
    _kill(first.pid)
    TensorBoardRoute.objects.update(issued_at=timezone.now() - timedelta(minutes=5))
    assert tensorboard.routes_reap() == 1
    assert TensorBoardRoute.objects.get(pk=first.pk).state == "revoked"
    fresh = tensorboard.route_issue(job_id=jobs[0].id)
    assert fresh.pk != first.pk and _alive(fresh.pid)

    # `make run` stopping: every local TensorBoard goes, its port is free.
    call_command("tensorboard_stop")
    for route in (fresh, second):
        assert not _alive(route.pid) and _port_free(route.port)
    assert not TensorBoardRoute.objects.filter(state="active").exists()


IMPOSTOR = r"""
import http.server, socketserver, sys
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<!doctype html><script>fetch('/api/v1/tokens/')</script>IMPOSTOR"
        self.send_response(200); self.send_header("Content-Type", "text/html"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
socketserver.TCPServer.allow_reuse_address = True
with socketserver.TCPServer(("127.0.0.1", int(sys.argv[1])), Page) as server:
    print("listening", flush=True)
    server.serve_forever()
"""


def _tb_job(platform, name):
    base = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "tensorboard": True}
    return services.job_submit(user=platform, data={**base, "command": ["true"], "name": name})[0]


def test_the_proxy_refuses_a_port_that_another_process_took_after_tensorboard_died(platform):
    import subprocess
    import sys

    job = _tb_job(platform, "impersonated")
    route = tensorboard.route_issue(job_id=job.id)
    member = Client()
    member.force_login(platform)
    assert _get_until_ok(member, f"/tb/{job.id}/").status_code == 200
    os.killpg(route.pid, 9)  # the TensorBoard dies; the route is still active until the reaper's next pass
    deadline = time.monotonic() + 10
    while not _port_free(route.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(route.port)], stdout=subprocess.PIPE)
    try:
        assert impostor.stdout.readline() == b"listening\n"
        # Its TensorBoard is gone: the visit starts a fresh one on another port; the impostor is never served.
        answer = member.get(f"/tb/{job.id}/")
        assert b"IMPOSTOR" not in answer.content
        relaunched = TensorBoardRoute.objects.get(pk=route.pk)
        assert relaunched.port != route.port and relaunched.pid != route.pid
        assert b"IMPOSTOR" not in _get_until_ok(member, f"/tb/{job.id}/").content
        # A live TensorBoard whose port someone else holds (it lost the bind race) is refused, never forwarded.
        TensorBoardRoute.objects.filter(pk=route.pk).update(port=route.port)
        answer = member.get(f"/tb/{job.id}/")
        assert answer.status_code == 502 and answer.json()["code"] == "tensorboard_not_verified"
        assert b"IMPOSTOR" not in answer.content and b"<script" not in answer.content
        assert member.get(f"/tb/{job.id}/index.js").status_code == 502
    finally:
        impostor.kill()
        impostor.wait()
    tensorboard.route_revoke(route_id=route.pk)


def test_signed_links_end_with_their_ttl_and_when_revoked(platform, settings):
    settings.TRAINYARD_TB_LINK_TTL_S = 4
    job = _tb_job(platform, "shared-link")
    tensorboard.route_issue(job_id=job.id)
    member = Client()
    member.force_login(platform)
    assert _get_until_ok(member, f"/tb/{job.id}/").status_code == 200
    link = tensorboard.signed_link(job.id)
    made = time.monotonic()
    time.sleep(2)
    anonymous = Client()
    assert anonymous.get(link).status_code == 200  # 2 s into its 4
    assert anonymous.get(f"/tb/{job.id}/").status_code == 200  # through the cookie it left
    time.sleep(max(0.0, made + 4.5 - time.monotonic()))
    assert anonymous.get(f"/tb/{job.id}/").status_code == 403  # the cookie ends with the link, not 4 s after the visit
    assert anonymous.get(link).status_code == 403

    settings.TRAINYARD_TB_LINK_TTL_S = 3600
    link = tensorboard.signed_link(job.id)
    holder = Client()
    assert holder.get(link).status_code == 200
    fresh = tensorboard.links_revoke(job_id=job.id)
    assert holder.get(f"/tb/{job.id}/").status_code == 403 and Client().get(link).status_code == 403
    assert _get_until_ok(Client(), tensorboard.signed_link(job.id)).status_code == 200  # a new link works
    assert _get_until_ok(member, f"/tb/{job.id}/").status_code == 200  # members never needed one
    tensorboard.route_revoke(route_id=fresh.pk)


def test_a_member_revokes_the_links_over_the_api(platform):
    from rest_framework.test import APIClient

    job = _tb_job(platform, "revoke-api")
    tensorboard.route_issue(job_id=job.id)
    link = tensorboard.signed_link(job.id)
    api = APIClient()
    api.force_login(platform)
    answer = api.post(f"/api/v1/jobs/{job.id}/tensorboard/revoke-links/")
    assert answer.status_code == 200 and answer.json()["signed_url"] != link
    assert Client().get(link).status_code == 403
    assert _get_until_ok(Client(), answer.json()["signed_url"]).status_code == 200
    stranger = APIClient()
    stranger.force_login(UserFactory(username="stranger"))
    assert stranger.post(f"/api/v1/jobs/{job.id}/tensorboard/revoke-links/").status_code == 404
    tensorboard.routes_stop_all()
    gone = api.post(f"/api/v1/jobs/{job.id}/tensorboard/revoke-links/")
    assert gone.status_code == 404 and gone.json()["code"] == "tensorboard_not_running"


def test_a_tensorboard_that_exited_is_started_again_under_the_same_route_on_the_next_visit(platform):
    """Its port can be taken between being chosen and being bound (or the process crashes): the next visit
    relaunches it on a fresh port under the same route, so shared links keep working and nobody waits on 503."""
    job = _tb_job(platform, "crashes")
    route = tensorboard.route_issue(job_id=job.id)
    link = tensorboard.signed_link(job.id)
    _kill(route.pid)

    member = Client()
    member.force_login(platform)
    page = _get_until_ok(member, f"/tb/{job.id}/")
    assert page.status_code == 200 and b"TensorBoard" in page.content
    again = TensorBoardRoute.objects.get(pk=route.pk)
    assert again.state == "active" and again.pid != route.pid and _alive(again.pid)
    assert Client().get(link).status_code == 200  # the link made before the crash still opens it
    tensorboard.route_revoke(route_id=route.pk)
