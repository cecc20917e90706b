"""The OpenAPI schema stays valid and warning-free with the monitoring endpoints in it."""

from django.core.management import call_command


def test_schema_is_valid_without_warnings():
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")
