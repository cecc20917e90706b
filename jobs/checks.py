"""Startup checks (`manage.py check`, run by every management command and the web server): settings that
cannot work are reported before the first job is submitted, with the setting named."""

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.compatibility)
def volcano_backend_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    if settings.TRAINYARD_BACKEND != "volcano":
        return []
    from jobs.backends.volcano import config_from_settings
    from jobs.backends.volcano_render import ManifestError

    try:
        config_from_settings()
    except ManifestError as exc:
        return [checks.Error(str(exc), id="jobs.E001")]
    return []
