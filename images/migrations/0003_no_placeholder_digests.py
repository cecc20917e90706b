"""Earlier seeds gave the external bases made-up digests (sha256:1111…, 2222…) and a "passed" scan nobody ran.
Clear both where they are still the seed's: such a base is unresolved and unscanned until a real pull or scan."""

from django.db import migrations

PLACEHOLDERS = ["sha256:" + d * 64 for d in "1234"]


def forget_placeholders(apps, schema_editor):
    BaseImage = apps.get_model("images", "BaseImage")
    BaseImage.objects.filter(digest__in=PLACEHOLDERS).update(digest="", scan_status="unscanned")


class Migration(migrations.Migration):
    dependencies = [("images", "0002_builds_scans_policies")]
    operations = [migrations.RunPython(forget_placeholders, migrations.RunPython.noop)]
