"""Domain errors and the one DRF exception handler that turns every error into JSON with a stable code.

An outage of PostgreSQL or Redis is a 503 with `database_unavailable` / `broker_unavailable` and `Retry-After`,
from the API's handler and, for errors raised outside a view (middleware, sessions), from `server_error`.
"""

import math
import sys
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class DomainError(Exception):
    """An error a user can act on; `code` is stable and documented, `http_status` says how it maps."""

    code = "error"
    http_status = status.HTTP_400_BAD_REQUEST

    def __init__(self, detail: str, *, code: str | None = None, field: str | None = None, **extra: Any):
        super().__init__(detail)
        self.detail = detail
        if code:
            self.code = code
        self.field = field
        self.extra = extra


class ValidationFailed(DomainError):
    code = "invalid"


class ValidationErrors(ValidationFailed):
    """Several problems found at once (each a ValidationFailed with its field), in the order a form shows them;
    the response's `code` and `detail` are the first one's and `fields` holds them all."""

    def __init__(self, errors: list[ValidationFailed]):
        first = errors[0]
        super().__init__(first.detail, code=first.code, field=first.field)
        self.errors = errors


class NotFound(DomainError):
    code = "not_found"
    http_status = status.HTTP_404_NOT_FOUND


class Forbidden(DomainError):
    code = "permission_denied"
    http_status = status.HTTP_403_FORBIDDEN


class Conflict(DomainError):
    code = "conflict"
    http_status = status.HTTP_409_CONFLICT


def _codes(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {k: _codes(v) for k, v in detail.items()}
    if isinstance(detail, list):
        return [_codes(v) for v in detail]
    return {"message": str(detail), "code": getattr(detail, "code", "invalid")}


OUTAGE_RETRY_AFTER_S = 5


def outage_code(exc: BaseException | None) -> str | None:
    """`database_unavailable` / `broker_unavailable` when `exc` means that service cannot be reached, else None."""
    import redis
    from django.db import InterfaceError, OperationalError
    from kombu.exceptions import OperationalError as KombuOperationalError

    if isinstance(exc, (OperationalError, InterfaceError)):
        return "database_unavailable"
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, KombuOperationalError)):
        return "broker_unavailable"
    return None


class OutageAfterWrite(Exception):
    """The database or the broker went away after a request's write was made, or while it committed: the 503 (with
    `Retry-After`, as every outage) names what the write made (`extra`), so a client learns of it instead of
    sending it again."""

    def __init__(self, code: str, detail: str, **extra: Any):
        super().__init__(detail)
        self.code, self.detail, self.extra = code, detail, extra


def _outage_body(code: str) -> dict[str, Any]:
    what = "the database" if code == "database_unavailable" else "the message broker (Redis)"
    detail = f"{what} cannot be reached right now; try again shortly"
    return {"code": code, "detail": detail, "retry_after": OUTAGE_RETRY_AFTER_S}


def server_error(request, *args, **kwargs) -> HttpResponse:
    """Django's handler500: JSON for the API (503 during an outage, else 500); a short page for the portal."""
    code = outage_code(sys.exc_info()[1])
    status_code = 503 if code else 500
    if request.path.startswith("/api/"):
        body = _outage_body(code) if code else {"code": "server_error", "detail": "internal error"}
        response: HttpResponse = JsonResponse(body, status=status_code)
    else:
        text = _outage_body(code)["detail"] if code else "internal error"
        response = HttpResponse(f"Trainyard: {text}\n", status=status_code, content_type="text/plain; charset=utf-8")
    if code:
        response["Retry-After"] = str(OUTAGE_RETRY_AFTER_S)
    return response


def exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, OutageAfterWrite):
        body = {**_outage_body(exc.code), "detail": exc.detail, **exc.extra}
        return Response(body, status=503, headers={"Retry-After": str(OUTAGE_RETRY_AFTER_S)})
    code = outage_code(exc)
    if code:
        return Response(_outage_body(code), status=503, headers={"Retry-After": str(OUTAGE_RETRY_AFTER_S)})
    if isinstance(exc, DomainError):
        body: dict[str, Any] = {"code": exc.code, "detail": exc.detail, **exc.extra}
        fields: dict[str, list[dict[str, str]]] = {}
        for one in getattr(exc, "errors", None) or [exc]:
            if one.field:
                fields.setdefault(one.field, []).append({"message": one.detail, "code": one.code})
        if fields:
            body["fields"] = fields
        if len(getattr(exc, "errors", None) or []) > 1:
            body["detail"] = f"{len(exc.errors)} problems: " + "; ".join(e.detail for e in exc.errors)
        # Every 503 says when to come back (a registry, store or cluster that is down), as the outage ones do.
        headers = {"Retry-After": str(OUTAGE_RETRY_AFTER_S)} if exc.http_status == 503 else None
        return Response(body, status=exc.http_status, headers=headers)
    if isinstance(exc, RequestDataTooBig):
        return Response({"code": "request_too_large", "detail": str(exc)}, status=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _codes(exc.detail)
        first = _first_code(fields)
        response.data = {"code": first or "invalid", "detail": "The request is invalid.", "fields": fields}
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else "error"
        response.data = {"code": code, "detail": str(exc.detail)}
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            # One number for the header clients obey and the body: whole seconds, rounded up, at least 1.
            wait = max(1, math.ceil(exc.wait))
            response["Retry-After"] = str(wait)
            response.data["retry_after"] = wait
    return response


def _first_code(fields: Any) -> str | None:
    if isinstance(fields, dict):
        if "code" in fields and "message" in fields:
            return fields["code"]
        for v in fields.values():
            found = _first_code(v)
            if found:
                return found
    if isinstance(fields, list):
        for v in fields:
            found = _first_code(v)
            if found:
                return found
    return None


def page_not_found(request, exception):
    """A URL that matches no route: JSON with a code under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        from django.http import JsonResponse

        return JsonResponse({"code": "not_found", "detail": "no such API endpoint"}, status=404)
    from django.views.defaults import page_not_found as default

    return default(request, exception)
