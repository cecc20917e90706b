"""Each queue's waiting line as an index in the dispatcher's order (preemptible last, then priority, then age):
places in line are computed when read (0029), and a page with a few waiting jobs ranked its whole line by sorting
it (18 ms for a 12,000-job line on the development VM); read in index order it takes 5 ms. Partial (waiting rows
only), so admissions and later state changes do not write it."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('images', '0006_imagebuild_scan_feed'),
        ('jobs', '0029_queue_position_computed'),
        ('quotas', '0012_team_slug_reserved'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'pending')), fields=['queue', 'preemptible', '-priority', 'submitted_at', 'id'], name='job_waiting_line'),
        ),
    ]
