"""The portal's datasets page and the submit form's datasets field (rows in the database; the store is not needed
for claims and for the checks the form shows)."""

import re

from frontend.tests.conftest import login
from frontend.tests.test_views import error_block
from jobs.models import Dataset, Job
from quotas.models import Team


def test_datasets_page_lists_what_the_users_teams_may_read(portal):
    demo = Team.objects.get(slug="demo")
    Dataset.objects.create(team=demo, name="imagenet", version=3, s3_prefix="ds/imagenet/3/", size_bytes=3 * 1024**3,
                           file_count=1281167)  # fmt: skip
    Dataset.objects.create(team=portal.other_team, name="faces", claim="faces-pvc")
    shared = Dataset.objects.create(team=portal.other_team, name="street", s3_prefix="ds/street/", size_bytes=10,
                                    file_count=2)  # fmt: skip
    shared.shared_with.add(demo)
    body = login(portal.demo).get("/datasets/").content.decode()
    assert "imagenet" in body and "3.0\xa0GB" in body and "1281167" in body
    assert "street" in body and "faces" not in body  # not shared with demo
    assert 'aria-current="page">Datasets' in body


def test_submit_form_sends_datasets_and_shows_their_errors(portal, settings):
    settings.TRAINYARD_BACKEND = "volcano"  # a claim dataset can be mounted there (the job is only validated)
    from jobs.tests.conftest import pin_catalog

    pin_catalog()
    demo = Team.objects.get(slug="demo")
    Dataset.objects.create(team=demo, name="corpus", version=2, claim="corpus-pvc")
    client = login(portal.demo)
    form = client.get("/jobs/new/").content.decode()
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', form).group(1)
    data = {"idempotency_key": key, "team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11",
            "command": "python train.py"}  # fmt: skip
    bad = client.post("/jobs/new/", {**data, "datasets": "corpus:9 /data"})
    assert bad.status_code == 400
    assert "unknown_dataset" in error_block(bad.content.decode(), "datasets")
    unreadable = client.post("/jobs/new/", {**data, "datasets": "just-a-name"})
    assert "line 1: expected NAME[:VERSION] /PATH" in error_block(unreadable.content.decode(), "datasets")
    good = client.post("/jobs/new/", {**data, "datasets": "corpus:2 /data\ncorpus /more"})
    assert good.status_code == 302, good.content.decode()[:2000]
    job = Job.objects.get()
    assert [(d["name"], d["version"], d["path"], d["claim"]) for d in job.datasets] == [
        ("corpus", 2, "/data", "corpus-pvc"),
        ("corpus", 2, "/more", "corpus-pvc"),
    ]
    # Opened again (run again with changes), the field shows the same lines.
    again = client.get(f"/jobs/new/?from={job.id}").content.decode()
    assert "demo/corpus:2 /data\ndemo/corpus:2 /more" in again
