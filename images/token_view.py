"""The registry token service as a route of the platform's web server (/registry/token), for a registry the
operator runs with `auth: token` pointed at the platform (docs/security.md, "Registry"). The embedded registry has
its own small server for the same code (`python -m images.registry_tokens`), so it works without the web process."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from images import registry_tokens


@require_GET
def registry_token(request: HttpRequest) -> JsonResponse:
    if not settings.TRAINYARD_REGISTRY_TOKEN_KEY:
        return JsonResponse(
            {"code": "registry_tokens_disabled", "detail": "this platform issues no registry tokens"}, status=404
        )
    config = registry_tokens.Config(
        key_path=settings.TRAINYARD_REGISTRY_TOKEN_KEY,
        service_user=settings.TRAINYARD_REGISTRY_USERNAME,
        service_password=settings.TRAINYARD_REGISTRY_PASSWORD,
    )
    status, body = registry_tokens.answer(
        config, authorization=request.headers.get("Authorization", ""), query=dict(request.GET.lists())
    )
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = f'Basic realm="{config.service}"'
    return response
