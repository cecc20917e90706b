"""The submit form's preemptible checkbox: refused with its reason where the queue does not take preemptible jobs,
accepted where it does, and shown on the job page."""

import re

from frontend.tests.conftest import login
from frontend.tests.test_views import error_block
from jobs.models import Job
from quotas.models import Queue


def test_submit_form_runs_a_job_preemptible_where_the_queue_allows_it(portal):
    client = login(portal.demo)
    form = client.get("/jobs/new/").content.decode()
    assert 'name="preemptible"' in form and "TRAINYARD_PREEMPT_NOTICE" in form
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', form).group(1)
    data = {
        "idempotency_key": key,
        "team": "demo",
        "queue": "debug",
        "spec": "shared",
        "image": "python-3.11",
        "command": "python train.py",
        "preemptible": "on",
    }
    refused = client.post("/jobs/new/", data)
    assert refused.status_code == 400 and not Job.objects.exists()
    assert "does not take preemptible jobs" in error_block(refused.content.decode(), "preemptible")
    Queue.objects.filter(name="debug").update(allow_preemptible=True)
    made = client.post("/jobs/new/", data)
    job = Job.objects.get()
    assert made.status_code == 302 and job.preemptible
    assert 'data-role="preemptible"' in client.get(f"/jobs/{job.id}/").content.decode()


def test_the_queue_page_says_its_class_pools_and_whether_jobs_may_borrow(portal):
    Queue.objects.filter(name="debug").update(priority_class="inference", pools=["small"], allow_preemptible=True)
    client = login(portal.demo)
    line = client.get("/queues/debug/").content.decode().split('data-role="queue-class"')[1].split("</p>")[0]
    assert "admitted before training queues" in line and "node pools: small" in line and "preemptible" in line
    train = client.get("/queues/train/").content.decode().split('data-role="queue-class"')[1].split("</p>")[0]
    assert "Training queue" in train and "every node pool" in train and "preemptible" not in train
