"""WebSocket routes, collected from the apps that stream to the browser."""

from django.urls import path

from jobs.consumers import JobLogConsumer

websocket_urlpatterns = [
    path("ws/jobs/<uuid:job_id>/logs/", JobLogConsumer.as_asgi()),
]
