"""Lockout after repeated failed logins on the portal's /login/ and the admin's /admin/login/.

Every failed password (Django's `user_login_failed`) counts in Redis, per user name and client address,
per address, and per user name, in a window of `TRAINYARD_LOGIN_WINDOW_S`. Past a limit, a login POST is
answered 429 with `Retry-After` before the password is even checked, so the right password does not help
either; a successful login clears its user-and-address count. The per-user limit is higher than the
per-address one: it stops a slow spread-out guess without letting one address lock a user out quickly.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

LOGIN_PATHS = ("/login/", "/admin/login/")


def _client(request: HttpRequest | None) -> str:
    return (request.META.get("REMOTE_ADDR") or "unknown") if request is not None else "unknown"


def _keys(username: str, client: str) -> list[tuple[str, int]]:
    name = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    return [
        (f"login-fail:user-client:{name}:{client}", settings.TRAINYARD_LOGIN_MAX_FAILURES),
        (f"login-fail:client:{client}", settings.TRAINYARD_LOGIN_MAX_FAILURES_PER_CLIENT),
        (f"login-fail:user:{name}", settings.TRAINYARD_LOGIN_MAX_FAILURES_PER_USER),
    ]


def locked(username: str, client: str) -> bool:
    keys = _keys(username, client)
    counts = cache.get_many([key for key, _ in keys])
    return any(counts.get(key, 0) >= limit for key, limit in keys)


@receiver(user_login_failed)
def _count_failure(sender, credentials, request=None, **kwargs) -> None:
    username = str(credentials.get("username") or "")
    for key, _limit in _keys(username, _client(request)):
        cache.add(key, 0, timeout=settings.TRAINYARD_LOGIN_WINDOW_S)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=settings.TRAINYARD_LOGIN_WINDOW_S)


@receiver(user_logged_in)
def _clear_failures(sender, request, user, **kwargs) -> None:
    cache.delete(_keys(user.get_username(), _client(request))[0][0])


class LoginLockoutMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        login = request.method == "POST" and request.path_info in LOGIN_PATHS
        if login and locked(str(request.POST.get("username") or ""), _client(request)):
            wait = settings.TRAINYARD_LOGIN_WINDOW_S  # at most: the window started at the first failure
            minutes = max(1, round(wait / 60))
            response = HttpResponse(
                f"Too many failed logins: try again within {minutes} minute(s).",
                status=429,
                content_type="text/plain; charset=utf-8",
            )
            response["Retry-After"] = str(wait)
            return response
        return self.get_response(request)
