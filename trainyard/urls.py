"""URL map: health probes, admin, REST API v1, OpenAPI docs, the portal."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from images.token_view import registry_token
from jobs.tb_proxy import tensorboard_proxy
from monitoring.metrics import metrics_view
from ops import health

handler500 = "kernel.errors.server_error"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("trainyard.api_urls")),
    path("metrics", metrics_view, name="metrics"),
    path("registry/token", registry_token, name="registry-token"),
    path("monitoring/", include("monitoring.urls")),
    path("tb/<uuid:job_id>/", tensorboard_proxy, name="tensorboard"),
    path("tb/<uuid:job_id>/<path:path>", tensorboard_proxy, name="tensorboard-path"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("", include("frontend.urls")),
]
handler404 = "kernel.errors.page_not_found"
