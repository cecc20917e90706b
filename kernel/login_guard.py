"""Failed logins on the portal's /login/ and the admin's /admin/login/: a lockout per client address and a
slow-down per user name that never locks the right password out.

Every failed password (Django's `user_login_failed`) counts in Redis over `TRAINYARD_LOGIN_WINDOW_S`, per user
name and client address, per address, and per user name from any address.

- Per address: past `TRAINYARD_LOGIN_MAX_FAILURES` on one user name, or `TRAINYARD_LOGIN_MAX_FAILURES_PER_CLIENT`
  in all, a login POST from that address is answered 429 with `Retry-After` before the password is checked. Only
  that address: the user still logs in from anywhere else.
- Per user name: past `TRAINYARD_LOGIN_SLOW_AFTER` failures from any mix of addresses, every login POST for that
  name is answered only after a pause that doubles with each further failure, up to `TRAINYARD_LOGIN_MAX_DELAY_S`;
  then the password is checked as usual, so the right one still logs in. The pause is the same for a right and a
  wrong password (the timing tells nothing) and the name is never locked: a guessing attack spread over many
  addresses slows each of its guesses down but cannot lock the owner out. The pause is taken in the ASGI layer
  (`LoginSlowdown`, trainyard/asgi.py), on the event loop, so it holds none of the request threads.

A successful login clears its user-and-address count. The address is the real peer's (`REMOTE_ADDR`, taken from
`X-Forwarded-For` only for `TRAINYARD_TRUSTED_PROXIES`, see ops/processes.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from urllib.parse import parse_qs

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

LOGIN_PATHS = ("/login/", "/admin/login/")
FIRST_DELAY_S = 0.25  # the pause at the first failure past TRAINYARD_LOGIN_SLOW_AFTER; doubles from there


def _client(request: HttpRequest | None) -> str:
    return (request.META.get("REMOTE_ADDR") or "unknown") if request is not None else "unknown"


def _name(username: str) -> str:
    return hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]


def _user_key(username: str) -> str:
    return f"login-fail:user:{_name(username)}"


def _keys(username: str, client: str) -> list[tuple[str, int]]:
    """The keys that lock an address out, with their limits."""
    return [
        (f"login-fail:user-client:{_name(username)}:{client}", settings.TRAINYARD_LOGIN_MAX_FAILURES),
        (f"login-fail:client:{client}", settings.TRAINYARD_LOGIN_MAX_FAILURES_PER_CLIENT),
    ]


def locked(username: str, client: str) -> bool:
    """Whether this address may not try this user name now (a 429)."""
    keys = _keys(username, client)
    counts = cache.get_many([key for key, _ in keys])
    return any(counts.get(key, 0) >= limit for key, limit in keys)


def delay_s(username: str) -> float:
    """How long a login for this user name waits before its password is checked: 0 until the name has
    `TRAINYARD_LOGIN_SLOW_AFTER` failures in the window, then FIRST_DELAY_S doubling per failure, at most
    `TRAINYARD_LOGIN_MAX_DELAY_S`."""
    over = int(cache.get(_user_key(username)) or 0) - settings.TRAINYARD_LOGIN_SLOW_AFTER
    if over < 0:
        return 0.0
    return min(float(settings.TRAINYARD_LOGIN_MAX_DELAY_S), FIRST_DELAY_S * 2 ** min(over, 20))


@receiver(user_login_failed)
def _count_failure(sender, credentials, request=None, **kwargs) -> None:
    username = str(credentials.get("username") or "")
    for key in [key for key, _ in _keys(username, _client(request))] + [_user_key(username)]:
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
        if request.method != "POST" or request.path_info not in LOGIN_PATHS:
            return self.get_response(request)
        username = str(request.POST.get("username") or "")
        if locked(username, _client(request)):
            wait = settings.TRAINYARD_LOGIN_WINDOW_S  # at most: the window started at the first failure
            minutes = max(1, round(wait / 60))
            response = HttpResponse(
                f"Too many failed logins from this address: try again within {minutes} minute(s).",
                status=429,
                content_type="text/plain; charset=utf-8",
            )
            response["Retry-After"] = str(wait)
            return response
        return self.get_response(request)


class LoginSlowdown:
    """ASGI wrapper: a login POST for a user name under a spread-out guessing attack waits `delay_s` before it
    reaches Django. The wait is an `asyncio.sleep` on the event loop, not a sleeping request thread, so many
    paused logins cannot take the web process's few HTTP threads from everyone else."""

    MAX_BODY = 64 * 1024  # a login form is a few hundred bytes; a larger body is passed on unread for the name

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in LOGIN_PATHS:
            return await self.app(scope, receive, send)
        received, body = [], b""
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body") or len(body) > self.MAX_BODY:
                break
        username = (parse_qs(body.decode("latin-1")).get("username") or [""])[0]
        pause = await asyncio.to_thread(delay_s, username)
        if pause:
            await asyncio.sleep(pause)  # the same for every password, so the timing tells nothing

        async def replay():
            return received.pop(0) if received else await receive()

        return await self.app(scope, replay, send)
