"""WebSocket routes, collected from the apps that stream to the browser."""

websocket_urlpatterns: list = []
