import copy, time, uuid
import pytest
from django.test import Client
from jobs import services
from jobs.models import Job

@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("waiting", [5000])
def test_probe_pages(platform, waiting):
    data = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": ["python", "t.py"]}
    base, _ = services.job_submit(user=platform, data=data)
    rows = []
    for i in range(waiting):
        j = copy.copy(base); j.pk = uuid.uuid4(); j.id = j.pk; j.idempotency_key = None
        rows.append(j)
    Job.objects.bulk_create(rows, batch_size=1000)
    c = Client(); c.force_login(platform)
    for path in [f"/jobs/{base.id}/", f"/jobs/{base.id}/live/", "/jobs/new/", "/queues/train/", "/queues/", "/jobs/", f"/api/v1/queues/train/"]:
        times = []
        for _ in range(3):
            t = time.perf_counter(); r = c.get(path); times.append(time.perf_counter() - t)
        print(f"\n{path}: {r.status_code} " + " ".join(f"{x*1000:.0f}" for x in times) + " ms")
