"""Per-user API tokens for CI: `ty_<prefix>_<secret>`, only the SHA-256 is stored, shown once.

A token carries scopes (read, submit, admin; `TokenScopePermission` checks them on every request) and can
only make tokens with no more scopes than itself that expire no later than itself.
"""

import functools
import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from quotas.models import TOKEN_SCOPES, ApiToken, default_token_scopes


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_create(
    *,
    user,
    name: str,
    expires_in_days: int | None = None,
    scopes: list[str] | None = None,
    parent: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """A new token; `parent` is the token the request came with (None for a browser session)."""
    from kernel.errors import ValidationFailed  # late: DRF imports this module while kernel.errors loads

    scopes = sorted(set(scopes if scopes is not None else (parent.scopes if parent else default_token_scopes())))
    unknown = set(scopes) - set(TOKEN_SCOPES)
    if unknown or not scopes:
        raise ValidationFailed(
            f"scopes must be some of {', '.join(TOKEN_SCOPES)}", code="invalid_token_scope", field="scopes"
        )
    expires = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
    if parent is not None:
        if set(scopes) - set(parent.scopes):
            raise ValidationFailed(
                "a token cannot make a token with scopes it does not have", code="scope_exceeds_token", field="scopes"
            )
        if parent.expires_at is not None:
            if expires is None:
                expires = parent.expires_at  # never longer-lived than the token that made it
            elif expires > parent.expires_at:
                raise ValidationFailed(
                    f"this token expires at {parent.expires_at.isoformat()}; it cannot make one that outlives it",
                    code="token_outlives_parent",
                    field="expires_in_days",
                )
    from django.conf import settings
    from django.db.models import Q

    live = ApiToken.objects.filter(user=user, revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )
    if live.count() >= settings.TRAINYARD_MAX_TOKENS_PER_USER:
        raise ValidationFailed(
            f"you already have {settings.TRAINYARD_MAX_TOKENS_PER_USER} live tokens: revoke one you no longer use",
            code="too_many_tokens",
        )
    prefix = secrets.token_hex(4)
    raw = f"ty_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        user=user, name=name, prefix=prefix, digest=_digest(raw), expires_at=expires, scopes=scopes
    )
    return token, raw


def required_scope(request, view) -> str:
    """read for GETs; writes need the view's `token_scope` (submit for jobs), else admin; token management, admin."""
    if getattr(view, "token_scope_all", None):
        return view.token_scope_all
    if request.method in permissions.SAFE_METHODS:
        return "read"
    return getattr(view, "token_scope", "admin")


class TokenScopePermission(permissions.BasePermission):
    """A request made with a token may do only what the token's scopes allow; a session is not limited here."""

    def has_permission(self, request, view) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return True
        needed = required_scope(request, view)
        if needed not in token.scopes:
            raise exceptions.PermissionDenied(f"this token lacks the '{needed}' scope", code="token_scope")
        return True


def token_revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


@functools.cache
def _lookup():
    """The token-and-user statement (one JOIN on the digest's unique index) with the fields each row carries.

    Every API request runs it. Built by the ORM (`select_related("user")` and `.first()`), the query cost ~1 ms of
    the web process's CPU to compile and turn into objects, a fifth of a minimal authenticated GET (bench/submit.py);
    written once here, the two objects are made from the row with `Model.from_db`, as the ORM itself does."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    qn = connection.ops.quote_name
    user_model = get_user_model()
    parts, columns = [], []
    for alias, model in (("t", ApiToken), ("u", user_model)):
        fields = model._meta.concrete_fields
        converters = [(i, found) for i, f in enumerate(fields) if (found := f.get_db_converters(connection))]
        parts.append((model, [f.attname for f in fields], converters))
        columns += [f"{alias}.{qn(f.column)}" for f in fields]
    sql = (
        f"SELECT {', '.join(columns)} FROM {qn(ApiToken._meta.db_table)} t "
        f"JOIN {qn(user_model._meta.db_table)} u ON u.{qn(user_model._meta.pk.column)} = "
        f"t.{qn(ApiToken._meta.get_field('user').column)} WHERE t.{qn('digest')} = %s"
    )
    return sql, parts


def _token_with_user(digest: str) -> ApiToken | None:
    from django.db import connection

    from kernel.prepared import prepared_cursor

    sql, parts = _lookup()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [digest])
        row = cursor.fetchone()
    if row is None:
        return None
    made, at = [], 0
    for model, names, converters in parts:
        values = list(row[at : at + len(names)])
        at += len(names)
        for i, funcs in converters:
            for func in funcs:
                values[i] = func(values[i], None, connection)
        made.append(model.from_db(connection.alias, names, values))
    token, user = made
    token.user = user
    return token


class TokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer ty_…` (or `Token ty_…`)."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("malformed Authorization header")
        raw = header[1]
        token = _token_with_user(_digest(raw))
        now = timezone.now()
        if token is None or token.revoked_at is not None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("token expired")
        if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        request.api_token = token
        return token.user, token

    def authenticate_header(self, request):
        return "Bearer"


try:
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
        target_class = "quotas.tokens.TokenAuthentication"
        name = "tokenAuth"

        def get_security_definition(self, auto_schema):
            return {"type": "http", "scheme": "bearer", "bearerFormat": "ty_<prefix>_<secret>"}
except ImportError:  # pragma: no cover - drf-spectacular is a pinned dependency
    pass


class ScopedActionsMixin:
    """Read actions use the `read` rate, `create`/`batch` the `submit` rate, the rest `write`. Every view, even
    one with its own permission classes, also checks the scopes of the token a request came with."""

    submit_actions = frozenset({"create", "batch"})

    def get_permissions(self):
        found = super().get_permissions()
        if not any(isinstance(p, TokenScopePermission) for p in found):
            found.append(TokenScopePermission())
        return found

    def get_throttles(self):
        action = getattr(self, "action", None)
        if action in self.submit_actions:
            self.throttle_scope = "submit"
        elif self.request.method in ("GET", "HEAD", "OPTIONS"):
            self.throttle_scope = "read"
        else:
            self.throttle_scope = "write"
        return super().get_throttles()


def scope_table() -> list[tuple[str, str, str]]:
    """(scope, method, path) of every API operation a `read` token cannot do, read from the routes themselves with
    the very rule the permission applies (`required_scope`); docs/security.md prints it and a test compares."""
    from types import SimpleNamespace

    from drf_spectacular.generators import EndpointEnumerator

    rows = set()
    for path, _regex, method, callback in EndpointEnumerator().get_api_endpoints():
        view = callback.cls(**(getattr(callback, "initkwargs", None) or {}))
        scope = required_scope(SimpleNamespace(method=method), view)
        if scope != "read":
            rows.add((scope, method, path))
    order = {name: i for i, name in enumerate(TOKEN_SCOPES)}
    return sorted(rows, key=lambda r: (order.get(r[0], 99), r[2], r[1]))
