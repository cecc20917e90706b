"""Shared API pieces: model serializers that build their fields once, unknown fields refused, cursor pagination,
integer query parameters. The throttle and token scopes per action are `quotas.tokens.ScopedActionsMixin` (tokens
live in quotas)."""

import copy

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination

from kernel.errors import ValidationFailed
from kernel.sentences import stored


class ModelSerializer(serializers.ModelSerializer):
    """DRF's ModelSerializer, with the fields it works out from the model built once per class.

    DRF builds them again for every serializer made: each model field looked up, its keyword arguments worked out
    from the column (length, choices, validators, nullability) and a serializer field made from them. That was
    0.3 ms of a one-row answer's ~4 ms of CPU (a spec) and 0.8 ms of a submission's (its answer's 30 fields), on
    every request. Here the first instance's fields are kept as unbound templates, and each instance gets copies of
    them, the way DRF itself gives each instance its declared fields (a field's copy is a new field made with the
    same arguments; validators are shared). A subclass whose fields depend on the request or the instance must not
    use this class."""

    def get_fields(self):
        cls = type(self)
        built = cls.__dict__.get("_fields_built")
        if built is None:
            built = super().get_fields()  # fresh fields, never bound: only their copies are
            cls._fields_built = built
        return {name: copy.deepcopy(field) for name, field in built.items()}


class RejectUnknownFieldsMixin:
    """A serializer that answers a key it does not declare with 400 `unknown_field` naming it (next to the other
    fields' problems), instead of ignoring it: `{"gpu_mili": 1}` must not be a silent no-op."""

    def to_internal_value(self, data):
        unknown = sorted(set(data) - set(self.fields)) if isinstance(data, dict) else []
        errors = {name: [serializers.ErrorDetail("unknown field", code="unknown_field")] for name in unknown}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if errors and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **errors}) from None
            raise
        if errors:
            raise serializers.ValidationError(errors)
        return value


class NewestFirstCursor(CursorPagination):
    ordering = ("-submitted_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(self, queryset, request, view=None):
        # A forged cursor can decode to a position the database refuses (2025-02-30): that is a bad cursor, not a 500.
        try:
            return super().paginate_queryset(queryset, request, view)
        except (DjangoValidationError, ValueError, OverflowError):
            raise _bad_cursor() from None

    def decode_cursor(self, request):
        # DRF answers an undecodable cursor with a 404; it is a bad query parameter like any other.
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise _bad_cursor() from None


def _bad_cursor() -> ValidationFailed:
    return ValidationFailed(
        stored("the cursor is not one this API made: follow the next or previous link of a page as given"),
        code="invalid_parameter",
        field="cursor",
    )


def int_param(request, name: str, *, default: int, minimum: int = 0) -> int:
    """An integer query parameter, or a 400 with code `invalid_parameter` naming it."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationFailed(f"{name} must be an integer", code="invalid_parameter", field=name)
    if value < minimum:
        raise ValidationFailed(f"{name} must be at least {minimum}", code="invalid_parameter", field=name)
    return value


RejectUnknownFieldsMixin.rejects_unknown_fields = True

# The 4xx answers the platform's middleware and framework give any operation (auth, scopes, throttles), and those
# that come with a path parameter, a body or a query string. Every error body is {"code", "detail", ...}.
ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "stable, documented error code"},
        "detail": {"type": "string"},
        "fields": {"type": "object", "additionalProperties": True},
    },
    "required": ["code"],
    "additionalProperties": True,
}
# Any operation can meet an outage of PostgreSQL or Redis (or of the registry, store or cluster it needs): a 503 with
# Retry-After. A submission whose write was made names what it made, so a client never sends it twice blindly.
UNAVAILABLE_SCHEMA = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "database_unavailable, broker_unavailable, or the unavailable service's own code",
        },
        "detail": {"type": "string"},
        "retry_after": {"type": "integer", "description": "seconds; the Retry-After header says the same"},
        "job_id": {
            "type": "string",
            "format": "uuid",
            "description": "a submission's job, when the outage came after its write was made",
        },
        "job_ids": {
            "type": "array",
            "items": {"type": "string", "format": "uuid"},
            "description": "a batch submission's jobs, when the outage came after their write was made",
        },
        "job_exists": {
            "type": "boolean",
            "nullable": True,
            "description": "true: the named job(s) were kept, do not submit again; null: the outage came during "
            "the commit, so GET the job (404: it was not kept) or resend with the same Idempotency-Key",
        },
    },
    "required": ["code", "detail"],
    "additionalProperties": True,
}
UNAVAILABLE_RESPONSE = {
    "description": "an outage: try again after Retry-After seconds (a submission's answer names what it made)",
    "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait"}},
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Unavailable"}}},
}
ERROR_WORDS = {
    "400": "invalid input (the code says which rule, `fields` which field)",
    "401": "not authenticated",
    "403": "not allowed (or the token lacks the scope: token_scope)",
    "404": "no such object, or not yours to see",
    "409": "the object's state forbids it now",
    "406": "no representation the Accept header allows (the API answers JSON)",
    "413": "request body too large",
    "415": "unsupported media type",
    "429": "throttled: retry after Retry-After seconds",
}


def schema_declare_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: declare on every operation the 4xx it can answer (with the shared Error
    body) and the 503 of an outage (with Retry-After and what a submission made), and `additionalProperties:
    false` on request bodies whose serializer refuses unknown fields."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    components["Unavailable"] = UNAVAILABLE_SCHEMA
    for path, methods in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in methods.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            # Every operation: 400 a NUL byte in the path or query string, 404 an unknown `?format=` (or a path or
            # query naming what is not there or not yours), 406 an Accept nothing renders, 413 a Content-Length over
            # the limit (even on a GET); and 401, 403, 429.
            codes = {"400", "401", "403", "404", "406", "413", "429"}
            if method in {"post", "put", "patch", "delete"}:
                codes |= {"409", "415"}
            responses = operation["responses"]
            for code in sorted(codes):
                responses.setdefault(
                    code,
                    {
                        "description": ERROR_WORDS[code],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                    },
                )
            responses.setdefault("503", UNAVAILABLE_RESPONSE)
    for component in generator.registry._components.values():
        if component.type != "schemas" or not component.name.endswith("Request"):
            continue
        target = component.object
        if getattr(target, "rejects_unknown_fields", False) and component.name in components:
            components[component.name]["additionalProperties"] = False
    return result
