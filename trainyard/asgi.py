"""ASGI entry point: HTTP through Django's WSGI handler on a fixed pool of threads, WebSockets through Channels.

Django's own ASGI handler starts a fresh thread for every request, so each request pays for new database
and Redis connections and several sync/async hops; the platform's views are all synchronous, so HTTP runs
them on long-lived worker threads instead (kernel/wsgibridge.py), each keeping its connections (CONN_MAX_AGE).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402

django_wsgi = get_wsgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import StaticFilesHandler  # noqa: E402

from kernel.login_guard import LoginSlowdown  # noqa: E402
from kernel.warmup import http_thread  # noqa: E402
from kernel.wsgibridge import ThreadedWSGI  # noqa: E402
from trainyard.routing import websocket_urlpatterns  # noqa: E402


class SafeStaticFilesHandler(StaticFilesHandler):
    """Static files, where a path that tries to leave the folder (`..`, encoded or not) or holds a NUL byte is a
    plain 404 instead of a server error."""

    def get_response(self, request):
        from django.core.exceptions import SuspiciousOperation
        from django.http import HttpResponseNotFound

        try:
            return super().get_response(request)
        except (SuspiciousOperation, ValueError):
            return HttpResponseNotFound("not found", content_type="text/plain")


if settings.TRAINYARD_SERVE_STATIC:
    django_wsgi = SafeStaticFilesHandler(django_wsgi)

if settings.TRAINYARD_GC_FREEZE:
    from kernel import gctune  # noqa: E402

    gctune.freeze_after_startup()
    django_wsgi = gctune.RefreezeAfterWarmup(django_wsgi)

from kernel.guards import trusted_proxies_check  # noqa: E402

trusted_proxies_check()  # a placeholder or a typo there trusts no proxy: say so at start

application = ProtocolTypeRouter(
    {
        "http": LoginSlowdown(
            ThreadedWSGI(
                django_wsgi,
                workers=settings.TRAINYARD_HTTP_THREADS,
                warm=http_thread if settings.TRAINYARD_HTTP_WARM else None,
            )
        ),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
