"""WSGI entry point (HTTP only; the platform normally runs under ASGI for WebSockets)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")
application = get_wsgi_application()
