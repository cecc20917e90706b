"""TensorBoard routes: issue when a job starts, revoke when it ends plus a grace period, proxy with auth.

Locally each route is a real `tensorboard` process on a free loopback port, served under the platform's
authenticated reverse proxy at `/tb/<job-id>/` (TensorBoard runs with that path prefix). Ports are
claimed under a database constraint, so two routes never share one. Access: members of the job's team,
staff, or whoever holds a short-lived signed link.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import structlog
from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.backends import sandbox
from jobs.models import Job, TensorBoardRoute

log = structlog.get_logger(__name__)
SIGNER_SALT = "trainyard.tensorboard"


def route_path(job_id) -> str:
    return f"/tb/{job_id}/"


def default_logdir(job: Job) -> str:
    """The job's TensorBoard folder, always inside its own folder (the API refuses paths that leave it)."""
    from jobs.backends.local import job_path

    root = Path(settings.TRAINYARD_WORK_ROOT) / str(job.id)
    try:
        return str(job_path(root, job.tensorboard_logdir, default="tensorboard"))
    except ValueError:
        return str(root / "tensorboard")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def route_issue(*, job_id) -> TensorBoardRoute | None:
    """Start the job's TensorBoard (once) and record its route."""
    job = Job.objects.get(pk=job_id)
    if not job.tensorboard or job.is_terminal:
        return None
    existing = TensorBoardRoute.objects.filter(job=job, state=TensorBoardRoute.State.ACTIVE).first()
    if existing is not None:
        return existing
    if settings.TRAINYARD_BACKEND != "local":
        from jobs.backends import get_backend

        host = get_backend().tensorboard_expose(job_id=str(job.id), namespace=job.team.namespace)
        return TensorBoardRoute.objects.create(
            job=job, backend=settings.TRAINYARD_BACKEND, logdir=default_logdir(job), host=host
        )
    logdir = default_logdir(job)
    Path(logdir).mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        port = _free_port()
        try:
            with transaction.atomic():
                route = TensorBoardRoute.objects.create(job=job, backend="local", logdir=logdir, port=port)
        except IntegrityError:
            continue  # the port (or the job's route) was claimed at the same moment: try another port
        _launch(route)
        log.info("tensorboard_issued", job_id=str(job.id), port=port)
        return route
    raise RuntimeError("could not claim a free port for TensorBoard")


def _launch(route: TensorBoardRoute) -> None:
    """Start the route's TensorBoard on its port and record its pid."""
    argv = sandbox.wrap(
        sandbox.service_plan(job_id=str(route.job_id), readable=[Path(route.logdir)]),
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            route.logdir,
            "--host",
            "127.0.0.1",
            "--port",
            str(route.port),
            "--path_prefix",
            route_path(route.job_id).rstrip("/"),
            "--reload_interval",
            "15",
        ],
    )
    proc = subprocess.Popen(
        argv,
        # None of the platform's own environment (database and Redis URLs with their passwords).
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    TensorBoardRoute.objects.filter(pk=route.pk).update(pid=proc.pid)
    route.pid = proc.pid


def route_relaunch_if_dead(route: TensorBoardRoute) -> TensorBoardRoute:
    """A local route whose TensorBoard exited (it lost its port to another process between the port being
    chosen and bound, or it crashed) gets a fresh process on a fresh port under the same route, so the page,
    shared links and their cookies keep working. The route is returned as it now is; a live one is untouched."""
    if route.backend != "local" or not route.pid or _alive(route.pid):
        return route
    with transaction.atomic():
        locked = TensorBoardRoute.objects.select_for_update().filter(pk=route.pk, state="active").first()
        if locked is None or locked.pid != route.pid:
            return locked or route  # revoked meanwhile, or another request relaunched it already
        for _ in range(5):
            port = _free_port()
            if not TensorBoardRoute.objects.filter(state="active", port=port).exists():
                break
        else:
            raise RuntimeError("could not claim a free port for TensorBoard")
        locked.port, locked.issued_at = port, timezone.now()
        locked.save(update_fields=["port", "issued_at"])
        _launch(locked)
    log.warning("tensorboard_relaunched", job_id=str(route.job_id), port=port, dead_pid=route.pid)
    return locked


def route_expire(*, job_id) -> None:
    """The job ended: the route stays for the grace period, then the reaper revokes it."""
    TensorBoardRoute.objects.filter(job_id=job_id, state=TensorBoardRoute.State.ACTIVE, expires_at__isnull=True).update(
        expires_at=timezone.now() + timedelta(seconds=settings.TRAINYARD_TB_GRACE_S)
    )


def route_revoke(*, route_id: int) -> None:
    with transaction.atomic():
        route = TensorBoardRoute.objects.select_for_update().get(pk=route_id)
        if route.state != TensorBoardRoute.State.ACTIVE:
            return
        if route.pid:
            _stop(route.pid)
        if route.backend != "local" and route.host:
            from jobs.backends import get_backend

            get_backend(route.backend).tensorboard_remove(job_id=str(route.job_id), namespace=route.job.team.namespace)
        route.state = TensorBoardRoute.State.REVOKED
        route.revoked_at = timezone.now()
        route.save(update_fields=["state", "revoked_at"])
    log.info("tensorboard_revoked", job_id=str(route.job_id))


def _stop(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
            waited = os.waitpid(pid, os.WNOHANG) if _is_child(pid) else (0, 0)
            if waited[0] == pid:
                return
        except (ProcessLookupError, ChildProcessError):
            return
        import time

        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _is_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not serving
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def routes_reap() -> int:
    """Revoke every route whose grace period is over, and every local route whose TensorBoard process is gone
    (the machine restarted, the process died): the next request for it starts a fresh one."""
    now = timezone.now()
    active = TensorBoardRoute.objects.filter(state=TensorBoardRoute.State.ACTIVE)
    due = list(active.filter(expires_at__lte=now).values_list("id", flat=True))
    cutoff = now - timedelta(seconds=30)  # a route is written a moment before its process starts
    for route_id, pid in active.filter(backend="local", issued_at__lte=cutoff).values_list("id", "pid"):
        if route_id not in due and not _alive(pid):
            due.append(route_id)
    for route_id in due:
        route_revoke(route_id=route_id)
    return len(due)


def routes_stop_all() -> int:
    """Stop every local TensorBoard (the platform is stopping): none outlives the platform holding a port."""
    ids = list(
        TensorBoardRoute.objects.filter(state=TensorBoardRoute.State.ACTIVE, backend="local").values_list(
            "id", flat=True
        )
    )
    for route_id in ids:
        route_revoke(route_id=route_id)
    return len(ids)


def signed_link(job_id, *, route: TensorBoardRoute | None = None) -> str | None:
    """A shareable link to the job's active route, good for TRAINYARD_TB_LINK_TTL_S from now and bound to that
    route: revoking the route (its TensorBoard stopped, or `links_revoke`) ends every link to it. None when the
    job has no active route."""
    route = route or TensorBoardRoute.objects.filter(job_id=job_id, state=TensorBoardRoute.State.ACTIVE).first()
    if route is None:
        return None
    token = signing.TimestampSigner(salt=SIGNER_SALT).sign(f"{job_id}.{route.pk}")
    return f"{route_path(job_id)}?tb_sig={token}"


def link_age(job_id, token: str) -> float | None:
    """Seconds since the link was made, when `token` is a valid link to the job's active route (and younger than
    its TTL); None otherwise."""
    signer = signing.TimestampSigner(salt=SIGNER_SALT)
    try:
        value = signer.unsign(token, max_age=settings.TRAINYARD_TB_LINK_TTL_S)
        made = signing.b62_decode(token.split(":")[-2])  # value:timestamp:signature, the signature checked above
    except (signing.BadSignature, ValueError, IndexError):
        return None
    job, _, route_id = value.partition(".")
    if job != str(job_id) or not route_id.isdigit():
        return None
    live = TensorBoardRoute.objects.filter(pk=int(route_id), job_id=job_id, state=TensorBoardRoute.State.ACTIVE)
    if not live.exists():
        return None
    return max(0.0, timezone.now().timestamp() - made)


def check_signature(job_id, token: str) -> bool:
    return link_age(job_id, token) is not None


def links_revoke(*, job_id) -> TensorBoardRoute | None:
    """End every shared link to the job's TensorBoard: its route is replaced by a fresh one (a new TensorBoard
    on a new port), so links and the cookies they left name a route that no longer is."""
    route = TensorBoardRoute.objects.filter(job_id=job_id, state=TensorBoardRoute.State.ACTIVE).first()
    if route is None:
        return None
    route_revoke(route_id=route.pk)
    return route_issue(job_id=job_id)
