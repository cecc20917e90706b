"""Guards at the edge of the API: hostile input gets a 4xx with a stable code before it reaches a view.

- `RequestGuardMiddleware`: a NUL byte in the path or query string (`%00`) is a 400; a body larger than
  `DATA_UPLOAD_MAX_MEMORY_SIZE` (`TRAINYARD_MAX_BODY_BYTES`) is a 413, both as JSON with a code.
- `ContentSecurityPolicyMiddleware`: a Content-Security-Policy on every response (scripts from the platform
  only); the API docs page and TensorBoard, which need inline scripts, get a looser one.
- `untrusted_proxy_check` (in `RequestGuardMiddleware`) and `trusted_proxies_check` (at start): log once when
  requests arrive through a proxy whose `X-Forwarded-For` is not believed, or when `TRAINYARD_TRUSTED_PROXIES`
  holds something that is not an address or network (the manifests' placeholder): then every client has the
  proxy's address, and the per-address login lockout locks them out together.
- `StrictJSONParser`: JSON nested deeper than `MAX_JSON_DEPTH`, or holding a NUL byte in any key or string, is a
  400 (PostgreSQL cannot store NUL in text, and nothing a job takes needs 64 levels).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote_to_bytes

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 64
log = structlog.get_logger(__name__)
_warned_untrusted_proxy = False


def trusted_proxies_check(value: str | None = None) -> list[str]:
    """The entries of `TRAINYARD_TRUSTED_PROXIES` that are neither an address nor a network (logged as a warning at
    start: uvicorn would silently trust none of them)."""
    value = settings.TRAINYARD_TRUSTED_PROXIES if value is None else value
    bad = []
    for entry in filter(None, (e.strip() for e in value.split(","))):
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            bad.append(entry)
    if bad:
        log.warning(
            "trusted_proxies_invalid", entries=bad,
            hint="set TRAINYARD_TRUSTED_PROXIES to the reverse proxy's addresses or network (an ingress "
            "controller's pod CIDR); until then every client shares the proxy's address for the login lockout",
        )  # fmt: skip
    return bad


def untrusted_proxy_check(request: HttpRequest) -> bool:
    """Whether this request came through a proxy that is not trusted: it carries `X-Forwarded-For`, yet the peer
    the web process saw is none of the addresses in it (a trusted proxy's header would have given one of them).
    Logged once per process."""
    global _warned_untrusted_proxy
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if not forwarded:
        return False
    peer = request.META.get("REMOTE_ADDR", "")
    if peer in {part.strip() for part in forwarded.split(",")}:
        return False
    if not _warned_untrusted_proxy:
        _warned_untrusted_proxy = True
        log.warning(
            "untrusted_proxy", peer=peer,
            hint="a request came with X-Forwarded-For from an address not in TRAINYARD_TRUSTED_PROXIES: if the "
            "platform runs behind a reverse proxy or an ingress, name it there, or all its clients share its "
            "address for the login lockout and the rate limits",
        )  # fmt: skip
    return True


def error_response(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)


class RequestGuardMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        untrusted_proxy_check(request)
        raw_path = request.path_info.encode("utf-8", "surrogateescape")
        query = request.META.get("QUERY_STRING", "")
        if b"\x00" in raw_path or b"\x00" in unquote_to_bytes(query):
            return error_response(400, "invalid_characters", "NUL bytes are not allowed in the URL")
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return error_response(400, "invalid_content_length", "Content-Length must be a number")
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            return error_response(413, "request_too_large", f"the request body is over the limit of {limit} bytes")
        return self.get_response(request)


def _check(value) -> None:
    """Walk the parsed document without recursion: depth limit, no NUL in keys or strings."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise exceptions.ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", code="too_deep")
        if isinstance(item, str):
            if "\x00" in item:
                raise exceptions.ParseError("NUL bytes are not allowed in strings", code="invalid_characters")
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key:
                    raise exceptions.ParseError("NUL bytes are not allowed in keys", code="invalid_characters")
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", code="too_deep") from None
        _check(data)
        return data


CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)
CSP_LOOSE_PATHS = ("/api/docs/", "/tb/")
CSP_LOOSE = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; font-src 'self' data:; object-src 'none'; base-uri 'self'; "
    "frame-ancestors 'self'"
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "Content-Security-Policy" not in response:
            loose = request.path_info.startswith(CSP_LOOSE_PATHS)
            policy = CSP_LOOSE if loose else CSP
            try:  # live logs: the same host over WebSocket (not every browser counts ws: as 'self')
                host = request.get_host()
                policy = policy.replace("connect-src 'self'", f"connect-src 'self' ws://{host} wss://{host}")
            except Exception:  # noqa: BLE001 - a bad Host header already got its own 400
                pass
            response["Content-Security-Policy"] = policy
        return response
