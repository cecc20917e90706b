"""Rate limits per token (or per user for browser sessions), answered with 429 and Retry-After."""

from rest_framework.throttling import ScopedRateThrottle


class PerTokenThrottle(ScopedRateThrottle):
    def get_cache_key(self, request, view):
        token = getattr(request, "api_token", None)
        if token is not None:
            ident = f"token-{token.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}
