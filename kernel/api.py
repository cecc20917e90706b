"""Shared API pieces: unknown fields refused, cursor pagination, integer query parameters. The throttle and token
scopes per action are `quotas.tokens.ScopedActionsMixin` (tokens live in quotas)."""

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination

from kernel.errors import ValidationFailed
from kernel.sentences import stored


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
