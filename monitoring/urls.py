"""Monitoring pages, mounted at /monitoring/."""

from django.urls import path

from monitoring import views

app_name = "monitoring"

urlpatterns = [
    path("cluster/", views.cluster, name="cluster"),
    path("alerts/", views.alerts, name="alerts"),
    path("alerts/<int:alert_id>/<slug:verb>/", views.alert_action, name="alert-action"),
    path("gpus/<str:uuid>/<slug:verb>/", views.gpu_action, name="gpu-action"),
    path("jobs/<uuid:job_id>/charts/", views.job_charts, name="job-charts"),
]
