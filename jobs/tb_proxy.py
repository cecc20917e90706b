"""The authenticated reverse proxy in front of each job's local TensorBoard (`/tb/<job-id>/...`).

TensorBoard serves under the route's path prefix, but its page still names a few assets from the site's root
(`url(/font-roboto/...)` in its inline styles): those are rewritten into the prefix here, so nothing the page
loads leaves `/tb/<job-id>/` (where the access check and the cookie of a shared link apply).
"""

import re

import httpx
import structlog
from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from jobs.models import TensorBoardRoute
from jobs.selectors import jobs_visible_to
from jobs.tensorboard import link_age, route_relaunch_if_dead
from kernel import listeners

log = structlog.get_logger(__name__)

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "cookie",
    "authorization",
    # The body is read decoded (httpx undoes gzip), so the browser must get it plain and unlabelled: asking the
    # upstream on loopback for an encoding only costs a decode here.
    "accept-encoding",
}
# Copied from TensorBoard's answer; never content-encoding or content-length (the body is sent as read, decoded).
PASSED_HEADERS = ("cache-control", "etag", "last-modified", "location", "content-disposition")
REWRITTEN_TYPES = ("text/html", "text/css")
ROOT_URL = re.compile(rb"""url\((['"]?)/(?!/)""")
COOKIE = "tb_access"


def _cookie_name(job_id) -> str:
    return f"{COOKIE}_{str(job_id).replace('-', '')}"


def _into_prefix(body: bytes, job_id) -> bytes:
    """`url(/x)` → `url(/tb/<job-id>/x)`, leaving URLs already inside the prefix alone."""
    prefix = f"/tb/{job_id}/".encode()

    def fix(match: re.Match) -> bytes:
        start = match.end()
        if body.startswith(prefix, start - 1):
            return match.group(0)
        return b"url(" + match.group(1) + prefix

    return ROOT_URL.sub(fix, body)


def _not_ours(route: TensorBoardRoute) -> JsonResponse | None:
    """Forward only to the TensorBoard this route started: every socket listening on its port must be held by that
    process tree (kernel/listeners.py). A port bound by anyone else (the TensorBoard died and a local user took
    the port) is refused, so nothing but the platform's own TensorBoard is ever served under the portal's origin."""
    if not listeners.listening_inodes(route.port):
        response = JsonResponse(
            {"code": "tensorboard_starting", "detail": "TensorBoard is starting; retry shortly"}, status=503
        )
        response["Retry-After"] = "2"
        return response
    if listeners.held_by_tree(route.port, route.pid or 0, started_after=route.issued_at.timestamp()):
        return None
    log.warning("tensorboard_port_not_ours", job_id=str(route.job_id), port=route.port, pid=route.pid)
    return JsonResponse(
        {
            "code": "tensorboard_not_verified",
            "detail": "this job's TensorBoard port is held by a process the platform did not start; nothing is "
            "forwarded to it (the route is replaced once the platform sees its TensorBoard gone)",
        },
        status=502,
    )


@csrf_exempt
def tensorboard_proxy(request, job_id, path=""):
    signed = request.GET.get("tb_sig")
    age = link_age(job_id, signed) if signed else None
    via_link = age is not None
    # The cookie a link left holds the link itself: it is checked as the link is, so it ends when the link does
    # (its TTL counted from when the link was made, never from the visit) and with the route it names.
    remembered = request.get_signed_cookie(_cookie_name(job_id), default=None, salt="tb")
    via_cookie = bool(remembered) and link_age(job_id, remembered) is not None
    member = request.user.is_authenticated and jobs_visible_to(request.user).filter(pk=job_id).exists()
    if not (member or via_link or via_cookie):
        status = 404 if request.user.is_authenticated else 403
        return JsonResponse(
            {
                "code": "not_found" if status == 404 else "permission_denied",
                "detail": "no such TensorBoard, or you may not open it",
            },
            status=status,
        )
    route = TensorBoardRoute.objects.filter(job_id=job_id, state=TensorBoardRoute.State.ACTIVE).first()
    if route is None or route.backend != "local" or not route.port:
        return JsonResponse(
            {
                "code": "tensorboard_not_running",
                "detail": "TensorBoard is not running for this job (off, not started, or revoked)",
            },
            status=404,
        )
    route = route_relaunch_if_dead(route)
    refused = _not_ours(route)
    if refused is not None:
        return refused
    params = [(k, v) for k, v in request.GET.lists() if k != "tb_sig" for v in v]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    headers["accept-encoding"] = "identity"
    upstream = f"http://127.0.0.1:{route.port}/tb/{job_id}/{path}"
    try:
        with httpx.Client(timeout=30) as client:
            answer = client.request(request.method, upstream, params=params, headers=headers, content=request.body)
    except httpx.TransportError:
        response = JsonResponse(
            {"code": "tensorboard_starting", "detail": "TensorBoard is starting; retry shortly"}, status=503
        )
        response["Retry-After"] = "2"
        return response
    content_type = answer.headers.get("content-type", "application/octet-stream")
    body = answer.content
    if content_type.split(";")[0].strip() in REWRITTEN_TYPES:
        body = _into_prefix(body, job_id)
    response = HttpResponse(body, status=answer.status_code, content_type=content_type)
    for name in PASSED_HEADERS:
        if name in answer.headers:
            response[name] = answer.headers[name]
    if via_link:
        response.set_signed_cookie(
            _cookie_name(job_id),
            signed,
            salt="tb",
            path=f"/tb/{job_id}/",
            max_age=max(1, int(settings.TRAINYARD_TB_LINK_TTL_S - age)),
            httponly=True,
            samesite="Lax",
        )
    return response
