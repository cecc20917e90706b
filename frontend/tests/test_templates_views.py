"""Portal: "Run again with changes" (the submit form filled from a job) and the team's job templates."""

import html
import json
import re

import pytest

from frontend.tests.conftest import login, submit
from jobs.models import Job, JobTemplate
from quotas.models import Membership
from quotas.tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def field_value(body: str, name: str) -> str:
    match = re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', body) or re.search(
        rf'<textarea[^>]*name="{name}"[^>]*>(.*?)</textarea>', body, re.S
    )
    assert match, f"no field {name}"
    return html.unescape(match.group(1))


def checked(body: str, name: str) -> str:
    match = re.search(rf'<input type="radio" id="[^"]+" name="{name}" value="([^"]+)" checked', body)
    assert match, f"nothing checked for {name}"
    return match.group(1)


def form_post(**fields):
    data = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": "python train.py --lr 0.1",
        "env": "EPOCHS=3",
        "max_retries": "2",
        "labels": "exp=a",
        "idempotency_key": "k-1",
    }
    data.update(fields)
    return data


def test_run_again_with_changes_fills_the_form_from_the_job(portal):
    job = submit(
        portal.demo,
        command=["python", "train.py", "--lr", "0.1 0.2"],
        env={"EPOCHS": "3", "SEED": "7"},
        labels={"exp": "lr"},
        timeout_s=1800,
        priority=5,
        tensorboard=True,
        name="lr-sweep",
    )
    client = login(portal.demo)
    page = client.get(f"/jobs/{job.id}/")
    assert f'href="/jobs/new/?from={job.id}"' in page.content.decode()
    form = client.get(f"/jobs/new/?from={job.id}").content.decode()
    assert 'id="prefill-source"' in form
    assert field_value(form, "command") == "python train.py --lr '0.1 0.2'"
    assert field_value(form, "env") == "EPOCHS=3\nSEED=7"
    assert field_value(form, "labels") == "exp=lr"
    assert field_value(form, "timeout_s") == "1800" and field_value(form, "name") == "lr-sweep"
    assert (
        checked(form, "queue") == "train"
        and checked(form, "spec") == "shared"
        and checked(form, "image") == "python-3.11"
    )
    assert 'id="id_tensorboard" name="tensorboard" type="checkbox" value="on" checked' in form
    # the priority has no field on the form: it is carried and shown, not lost
    assert json.loads(field_value(form, "carried")) == {"priority": 5}
    # submit it with one change: a new job with the change, the rest as before
    data = form_post(command="python train.py --lr 0.3", env="EPOCHS=3\nSEED=7", carried='{"priority": 5}')
    response = client.post("/jobs/new/", data)
    assert response.status_code == 302
    new = Job.objects.exclude(pk=job.pk).get()
    assert new.command == ["python", "train.py", "--lr", "0.3"] and new.priority == 5 and new.env["SEED"] == "7"


def test_run_again_is_refused_for_a_job_of_another_team(portal):
    job = submit(portal.demo)
    assert login(portal.outsider).get(f"/jobs/new/?from={job.id}").status_code == 404
    assert login(portal.demo).get("/jobs/new/?from=not-a-uuid").status_code == 404


def test_tampered_carried_fields_are_a_form_error(portal):
    response = login(portal.demo).post("/jobs/new/", form_post(carried='{"owner": "root"}'))
    assert response.status_code == 400 and "invalid_carried" in response.content.decode()
    assert not Job.objects.exists()


def test_save_as_template_then_use_edit_and_delete_it(portal):
    client = login(portal.demo)
    saved = client.post(
        "/jobs/new/",
        form_post(save_template="1", template_name="baseline", template_description="the usual run"),
    )
    assert saved.status_code == 302 and saved["Location"].startswith("/templates/")
    template = JobTemplate.objects.get()
    assert template.team.slug == "demo" and template.body["command"] == "python train.py --lr 0.1"
    assert not Job.objects.exists(), "saving a template submits nothing"

    listing = client.get("/templates/").content.decode()
    assert f'id="template-{template.pk}"' in listing and "the usual run" in listing
    assert f'href="/jobs/new/?template={template.pk}"' in listing and f"/templates/{template.pk}/edit/" in listing

    form = client.get(f"/jobs/new/?template={template.pk}").content.decode()
    assert field_value(form, "command") == "python train.py --lr 0.1" and field_value(form, "env") == "EPOCHS=3"
    assert "template=baseline" in form

    edit = client.get(f"/templates/{template.pk}/edit/").content.decode()
    assert field_value(edit, "template_name") == "baseline" and "Save template" in edit
    changed = client.post(
        f"/templates/{template.pk}/edit/",
        form_post(save_template="1", template_name="baseline-v2", template_description="", command="python t.py"),
    )
    assert changed.status_code == 302
    template.refresh_from_db()
    assert template.name == "baseline-v2" and template.body["command"] == "python t.py"

    bad = client.post(
        f"/templates/{template.pk}/edit/", form_post(save_template="1", template_name="baseline-v2", queue="nope")
    )
    assert bad.status_code == 400 and "unknown_queue" in bad.content.decode()

    confirm = client.get(f"/templates/{template.pk}/delete/")
    assert confirm.status_code == 200 and "baseline-v2" in confirm.content.decode()
    assert JobTemplate.objects.exists(), "GET only asks"
    assert client.post(f"/templates/{template.pk}/delete/").status_code == 302
    assert not JobTemplate.objects.exists()


def test_template_errors_show_next_to_the_template_name(portal):
    client = login(portal.demo)
    bad = client.post("/jobs/new/", form_post(save_template="1", template_name="Bad Name"))
    assert bad.status_code == 400 and 'id="err-template_name"' in bad.content.decode()
    assert "invalid_template_name" in bad.content.decode()
    client.post("/jobs/new/", form_post(save_template="1", template_name="same"))
    again = client.post("/jobs/new/", form_post(save_template="1", template_name="same"))
    assert again.status_code == 400 and "template_exists" in again.content.decode()
    assert JobTemplate.objects.count() == 1


def test_templates_of_other_teams_are_invisible_and_teammates_cannot_edit(portal):
    client = login(portal.demo)
    client.post("/jobs/new/", form_post(save_template="1", template_name="baseline"))
    template = JobTemplate.objects.get()
    outsider = login(portal.outsider)
    assert "baseline" not in outsider.get("/templates/").content.decode()
    for url in (
        f"/jobs/new/?template={template.pk}",
        f"/templates/{template.pk}/edit/",
        f"/templates/{template.pk}/delete/",
    ):
        assert outsider.get(url).status_code == 404, url
    mate = UserFactory(username="mate")
    MembershipFactory(team=template.team, user=mate, role=Membership.Role.MEMBER)
    mate_client = login(mate)
    listing = mate_client.get("/templates/").content.decode()
    assert f"?template={template.pk}" in listing and f"/templates/{template.pk}/edit/" not in listing
    assert mate_client.post(f"/templates/{template.pk}/delete/").status_code == 404
    assert JobTemplate.objects.exists()
