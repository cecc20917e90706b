"""Per-user API tokens for CI: `ty_<prefix>_<secret>`, only the SHA-256 is stored, shown once."""

import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from quotas.models import ApiToken


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_create(*, user, name: str, expires_in_days: int | None = None) -> tuple[ApiToken, str]:
    prefix = secrets.token_hex(4)
    raw = f"ty_{prefix}_{secrets.token_urlsafe(32)}"
    expires = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
    token = ApiToken.objects.create(user=user, name=name, prefix=prefix, digest=_digest(raw), expires_at=expires)
    return token, raw


def token_revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
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
        token = ApiToken.objects.select_related("user").filter(digest=_digest(raw)).first()
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
