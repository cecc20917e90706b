"""REST API v1: one router for every app's viewsets."""

from rest_framework.routers import DefaultRouter

router = DefaultRouter()
urlpatterns = router.urls
