"""REST routes of monitoring, mounted at /api/v1/monitoring/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from monitoring import api

router = SimpleRouter()
router.register("alerts", api.AlertViewSet, basename="monitoring-alert")
router.register("rules", api.AlertRuleViewSet, basename="monitoring-rule")
router.register("gpus", api.MonitoredGpuViewSet, basename="monitoring-gpu")
router.register("jobs", api.JobMonitoringViewSet, basename="monitoring-job")
router.register("notifications", api.NotificationViewSet, basename="monitoring-notification")
urlpatterns = [
    path("usage/", api.UsageView.as_view(), name="monitoring-usage"),
    path("compare/", api.CompareView.as_view(), name="monitoring-compare"),
    path("scheduling/", api.SchedulingView.as_view(), name="monitoring-scheduling"),
    path("push-settings/", api.PushSettingsView.as_view(), name="monitoring-push-settings"),
    *router.urls,
]
