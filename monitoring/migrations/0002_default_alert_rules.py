"""Create the default alert rules (warning, critical, fatal) once; admins edit them afterwards."""

from django.db import migrations


def create_defaults(apps, schema_editor):
    from monitoring.defaults import seed_rules

    seed_rules(apps.get_model("monitoring", "AlertRule"))


class Migration(migrations.Migration):
    dependencies = [("monitoring", "0001_initial")]

    operations = [migrations.RunPython(create_defaults, migrations.RunPython.noop)]
